"""The node page (``GET /``) in Debian's headless Chromium, against ``nvdaemon run`` on a copy of a fixture host.

The agent guards its API with a token; the page is opened with it in the address fragment (and, in the second test,
typed into the page's form). A condition raised on the host appears on the open page without a reload, its ENTER
arriving over the ``/v1/events`` websocket, and its EXIT likewise once the host recovers. History, seeded with a
day of points in the agent's real store, is plotted. The layout is checked at a desktop and at a phone width
(nothing wider than the window; the two panels side by side on the desktop, one above the other on the phone), no
CSP violation or script error reaches the console, and both widths are saved as screenshots in the test artifacts
(``test-artifacts/browser/``). With the event stream off, the page says so and shows the events of its status reads.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nvdaemon.history.core import Acc
from nvdaemon.history.store import open_store
from tests.browser.chromium import console_errors, save_screenshot, wait_for
from tests.test_e2e import ROOT, Agent, free_port

TOKEN = "page-token-7f3a"
LOW = "0.50 0.40 0.30 2/1310 223344\n"
HIGH = "30.00 20.00 10.00 40/1310 223344\n"
DESKTOP = (1366, 900)
PHONE = (390, 844)
SEEDED = ("hwmon0/coretemp/temp1", "hwmon0/coretemp/temp2")

CONFIG = """
node: page-node
tiers: [core]
intervalSeconds: 0.5
stateDir: {state}
server: {{apiTokenFile: {token}}}
history: {{enabled: true, metrics: [temp_celsius, load1]}}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  stream: {{enabled: true}}
rules:
  - {{metric: load1, device: cpu, condition: load_high, severity: warning, threshold: 16, enterFor: 2, exitFor: 2}}
"""

Browser = Callable[[int, int], Any]  # tests/browser/conftest.py's browser_factory: (width, height) -> context


def seed_history(db: Path, now: float) -> int:
    """A day of 5-minute windows for two temperature sensors, written through the agent's own store."""
    store, _ = open_store(db)
    windows = []
    end = int(now // 300 * 300)
    for i in range(288):
        t = end - i * 300
        for n, device in enumerate(SEEDED):
            v = 55 + 10 * math.sin(i / 24 + n)
            windows.append((((("temp_celsius", device, ())), t), Acc(10, 10 * v, v - 2, v + 2)))
    written = store.write(windows)
    store.close()
    return written


def start_agent(tmp_path: Path, config_text: str) -> Agent:
    """``nvdaemon run`` on a copy of the faulty fixture host with its load low, the token file written, history
    seeded, under ``config_text`` (CONFIG's placeholders)."""
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)
    (host / "proc" / "loadavg").write_text(LOW)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    state = tmp_path / "state"
    state.mkdir()
    assert seed_history(state / "history.db", time.time()) == 2 * 288
    config = tmp_path / "config.yaml"
    config.write_text(config_text.format(state=state, token=token, port=free_port()))
    a = Agent(tmp_path, host, config)
    a.start()
    return a


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = start_agent(tmp_path, CONFIG)
    yield a
    a.kill()


@pytest.fixture
def agent_without_stream(tmp_path: Path) -> Iterator[Agent]:
    """No event stream and no history: the page falls back to /v1/status's recent events and shows no plots."""
    text = CONFIG.replace("stream: {{enabled: true}}", "stream: {{enabled: false}}").replace(
        "history: {{enabled: true, metrics: [temp_celsius, load1]}}\n", ""
    )
    assert "stream: {{enabled: false}}" in text and "history" not in text
    a = start_agent(tmp_path, text)
    yield a
    a.kill()


def js(driver: Any, script: str) -> Any:
    return driver.execute_script(script)


def rows(driver: Any, table: str, selector: str = "") -> int:
    count: int = js(driver, f"return document.querySelectorAll('#{table} tbody tr{selector}').length")
    return count


def layout(driver: Any) -> dict[str, Any]:
    """The window's width, the document's, and the two first panels' boxes."""
    out: dict[str, Any] = js(
        driver,
        """
        const box = (id) => { const r = document.getElementById(id).getBoundingClientRect();
                              return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; };
        return {inner: window.innerWidth, scroll: document.documentElement.scrollWidth,
                conditions: box('conditions-section'), events: box('events-section')};
        """,
    )
    return out


def opened(driver: Any, agent: Agent, fragment: str = "") -> None:
    driver.get(agent.base + "/" + fragment)
    wait_for(driver, lambda d: js(d, "return Number(document.body.dataset.statusLoads || 0) >= 1"), "/v1/status read")
    wait_for(driver, lambda d: js(d, "return document.body.dataset.ws === 'open'"), "the event stream open")


def test_a_condition_enters_and_exits_on_the_open_page(agent: Agent, browser_factory: Browser) -> None:
    with browser_factory(*DESKTOP) as page:
        opened(page, agent, f"#token={TOKEN}")
        assert TOKEN not in page.current_url  # taken out of the address at once
        assert rows(page, "conditions") == 0
        assert js(page, "return document.getElementById('node').textContent") == "page-node"

        (agent.host / "proc" / "loadavg").write_text(HIGH)
        wait_for(page, lambda d: rows(d, "conditions", "[data-condition=load_high]") == 1, "load_high on the page")
        wait_for(
            page,
            lambda d: rows(d, "events", "[data-condition=load_high][data-phase=ENTER][data-source=stream]") == 1,
            "the ENTER event over the websocket",
        )
        assert js(page, "return Number(document.body.dataset.statusLoads)") >= 1
        assert "warning" in js(page, "return document.querySelector('#conditions tbody tr').innerText")

        # History: the seeded day of both sensors is plotted (and load1, kept but empty so far, says so).
        wait_for(page, lambda d: js(d, "return Number(document.body.dataset.historyLoads || 0) >= 1"), "history read")
        plot = "document.querySelector('.plot[data-metric=temp_celsius]')"
        assert js(page, f"return Number({plot}.dataset.points)") >= 2 * 200
        assert js(page, f"return {plot}.querySelectorAll('polyline').length") == len(SEEDED)
        assert all(d in js(page, f"return {plot}.innerText") for d in SEEDED)

        box = layout(page)
        assert box["scroll"] <= box["inner"] == DESKTOP[0], box  # nothing wider than the window
        assert box["events"]["left"] >= box["conditions"]["right"], box  # side by side
        assert abs(box["events"]["top"] - box["conditions"]["top"]) < 1, box
        shot = save_screenshot(page, "node-page-desktop")
        assert shot.stat().st_size > 10_000

        with browser_factory(*PHONE) as phone:
            opened(phone, agent, f"#token={TOKEN}")
            wait_for(phone, lambda d: rows(d, "conditions", "[data-condition=load_high]") == 1, "load_high (phone)")
            box = layout(phone)
            assert box["scroll"] <= box["inner"] == PHONE[0], box
            assert box["events"]["top"] >= box["conditions"]["bottom"], box  # one above the other
            # Each row is a card whose cells carry their column's name.
            labels = js(
                phone, "return [...document.querySelectorAll('#conditions tbody td')].map(c => c.dataset.label)"
            )
            assert labels[:3] == ["Severity", "Condition", "Device"]
            save_screenshot(phone, "node-page-phone")
            assert console_errors(phone) == []

        (agent.host / "proc" / "loadavg").write_text(LOW)
        wait_for(
            page,
            lambda d: rows(d, "events", "[data-condition=load_high][data-phase=EXIT][data-source=stream]") == 1,
            "the EXIT event over the websocket",
        )
        wait_for(page, lambda d: rows(d, "conditions") == 0, "load_high gone from the conditions")
        assert TOKEN not in page.page_source and TOKEN not in js(page, "return document.body.innerText")
        assert console_errors(page) == []


def test_the_page_asks_for_the_token_and_refuses_a_wrong_one(agent: Agent, browser_factory: Browser) -> None:
    with browser_factory(*DESKTOP) as page:
        page.get(agent.base + "/")
        wait_for(page, lambda d: js(d, "return !document.getElementById('auth').hidden"), "the token form")
        assert js(page, "return document.getElementById('auth-error').hidden")
        for token in ("wrong-token", TOKEN):
            field = page.find_element("id", "token")
            field.clear()
            field.send_keys(token)
            page.find_element("id", "use-token").click()
            if token != TOKEN:
                wait_for(
                    page,
                    lambda d: js(d, "return !document.getElementById('auth-error').hidden"),
                    "the refusal said",
                )
        wait_for(page, lambda d: js(d, "return Number(document.body.dataset.statusLoads || 0) >= 1"), "status read")
        wait_for(page, lambda d: js(d, "return document.body.dataset.ws === 'open'"), "the stream open with the token")
        assert js(page, "return document.getElementById('auth').hidden")
        assert js(page, "return document.getElementById('token').value") == ""  # not left in the field
        # The token is kept in this tab's sessionStorage only: a reload keeps working without the form.
        page.refresh()
        wait_for(page, lambda d: js(d, "return document.body.dataset.ws === 'open'"), "the stream after a reload")
        assert js(page, "return document.getElementById('auth').hidden")
        # The only console errors: /v1/status refused (401) before the token and with the wrong one. The stream is
        # not tried until the API answers, and nothing else failed (no CSP violation, no script error).
        errors = console_errors(page)
        assert len(errors) >= 2 and all("/v1/status" in e and "401" in e for e in errors), errors


def test_without_the_stream_events_come_from_the_status_reads(
    agent_without_stream: Agent, browser_factory: Browser
) -> None:
    agent = agent_without_stream
    with browser_factory(*DESKTOP) as page:
        page.get(f"{agent.base}/#token={TOKEN}")
        wait_for(page, lambda d: js(d, "return document.body.dataset.ws === 'off'"), "the stream said to be off")
        assert "stream off" in js(page, "return document.getElementById('live').textContent")
        (agent.host / "proc" / "loadavg").write_text(HIGH)
        wait_for(
            page,
            lambda d: rows(d, "events", "[data-condition=load_high][data-phase=ENTER][data-source=status]") == 1,
            "the ENTER event from /v1/status",
        )
        assert rows(page, "conditions", "[data-condition=load_high]") == 1
        assert js(page, "return document.getElementById('history-section').hidden")  # history is off
        assert console_errors(page) == []
