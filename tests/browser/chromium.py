"""Headless Chromium for the page tests, driven through WebDriver: Debian's ``chromium`` and ``chromedriver`` from
PATH (packages chromium and chromium-driver, which scripts/ensure-test-deps installs where it can) and the selenium
client of the dev extra.

Nothing here downloads anything. Selenium is handed chromedriver's path (``Service(executable_path=...)``) and the
browser's (``binary_location``), so Selenium Manager, which would otherwise fetch a driver or a browser, never runs.

Every browser gets a profile directory of its own (``--user-data-dir``, a fresh temporary directory): its path is in
the command line of every process of that browser, which is how ``open_browser`` finds and ends any that outlive
``quit()`` before it removes the directory.

The viewport is set by device-metrics emulation, not only by ``--window-size``: headless Chromium makes no window
narrower than 500 px, so a 390 px phone would otherwise get a 500 px page. ``window.innerWidth`` and
``innerHeight`` are exactly the size asked for, ``devicePixelRatio`` is 1, and a screenshot is that many pixels.

``ARTIFACTS``: where ``save_screenshot`` writes, ``test-artifacts/browser`` in the repository, or ``browser`` under the
directory ``NVDAEMON_TEST_ARTIFACTS`` names (a CI job that keeps its artifacts elsewhere).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

ROOT = Path(__file__).resolve().parents[2]

# What the fixture hands a test: called with (width, height), used as ``with browser_factory(390, 844) as driver:``.
BrowserFactory = Callable[[int, int], AbstractContextManager["WebDriver"]]

# How long processes of a closed browser may take to exit before they are killed; a bound, not a wait.
EXIT_GRACE_S = 10.0


def artifacts_dir() -> Path:
    """``browser`` under ``$NVDAEMON_TEST_ARTIFACTS`` when that is set, else under the repository's test-artifacts."""
    base = os.environ.get("NVDAEMON_TEST_ARTIFACTS")
    return (Path(base).resolve() if base else ROOT / "test-artifacts") / "browser"


ARTIFACTS: Path = artifacts_dir()


def browser_path() -> str | None:
    """The browser's launcher on PATH: ``chromium`` on Debian, ``chromium-browser`` on some others."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def missing_browser() -> str | None:
    """Why no browser can be opened here (the skip reason tests/conftest.py groups as ``chromium``), or None."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed in the venv (the dev extra: pip install -e '.[dev]'); chromium tests skip"
    if browser_path() is None:
        return "no chromium on PATH (Debian package chromium)"
    if shutil.which("chromedriver") is None:
        return "no chromedriver on PATH (Debian package chromium-driver)"
    return None


def browser_arguments(width: int, height: int, profile: Path) -> list[str]:
    arguments = [
        "--headless=new",
        "--disable-dev-shm-usage",  # /dev/shm is 64 MiB in a container: shared memory goes to /tmp instead
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",  # Debian's launcher loads /usr/share/chromium/extensions unless told not to
        "--disable-gpu",
        "--lang=en-US",
    ]
    if os.geteuid() == 0:
        arguments.append("--no-sandbox")  # Chromium refuses to start as root with its sandbox on
    return arguments


@contextlib.contextmanager
def open_browser(width: int, height: int) -> Iterator[WebDriver]:
    """A headless Chromium showing a ``width`` x ``height`` viewport, through a chromedriver of its own. On leaving
    the block, even by an exception, the browser and chromedriver are quit, whatever of the browser is still running
    after that is killed, and the profile directory is removed."""
    reason = missing_browser()
    if reason is not None:
        raise RuntimeError(reason)
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.chrome.webdriver import WebDriver as Chrome

    chromium, chromedriver = browser_path(), shutil.which("chromedriver")
    assert chromium is not None and chromedriver is not None
    profile = Path(tempfile.mkdtemp(prefix="nvdaemon-chromium-"))
    try:
        options = Options()
        options.binary_location = chromium
        for argument in browser_arguments(width, height, profile):
            options.add_argument(argument)
        metrics = {"width": width, "height": height, "pixelRatio": 1.0, "mobile": False, "touch": False}
        options.add_experimental_option("mobileEmulation", {"deviceMetrics": metrics})
        options.add_experimental_option("prefs", {"intl.accept_languages": "en-US"})
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console_errors reads the console
        driver = Chrome(options=options, service=Service(executable_path=chromedriver))
        try:
            yield driver
        finally:
            driver.quit()  # ends the session (the browser), then chromedriver
    finally:
        end_processes_of(profile)
        shutil.rmtree(profile, ignore_errors=True)


def processes_of(profile: Path) -> list[int]:
    """Process ids with ``--user-data-dir=PROFILE`` in their command line: every process of the browser using it.
    Zombies have an empty command line, so a process that exited but was not reaped yet is not among them."""
    needle = b"\0--user-data-dir=" + os.fsencode(profile) + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # it exited while we looked
            continue
        if needle in b"\0" + cmdline:
            found.append(int(entry.name))
    return found


def end_processes_of(profile: Path) -> None:
    """Waits (a bound, EXIT_GRACE_S) for the browser's processes to exit after quit(), then kills what is left. It
    warns when it had to kill: a browser that outlives quit() is worth knowing about."""
    deadline = time.monotonic() + EXIT_GRACE_S
    while (left := processes_of(profile)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not left:
        return
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    warnings.warn(f"chromium processes {left} outlived quit() by {EXIT_GRACE_S:g} s and were killed", stacklevel=2)


# Chromedriver hands out each console entry once (``get_log`` drains it); what was read is kept here, per browser,
# so that ``console_errors`` sees entries a failing ``wait_for`` read before it.
_CONSOLE: weakref.WeakKeyDictionary[WebDriver, list[dict[str, Any]]] = weakref.WeakKeyDictionary()


def console_log(driver: WebDriver) -> list[dict[str, Any]]:
    """Every entry of the browser's console log since it opened: dicts with ``level``, ``source``, ``message``."""
    entries = _CONSOLE.setdefault(driver, [])
    get_log: Callable[[str], list[dict[str, Any]]] = driver.get_log  # selenium leaves get_log unannotated
    entries.extend(get_log("browser"))
    return list(entries)


def console_errors(driver: WebDriver) -> list[str]:
    """The SEVERE entries of the console log as ``"SOURCE: MESSAGE"``: uncaught exceptions, ``console.error``, failed
    loads, and Content-Security-Policy violations (source ``security``). A page test asserts this is empty."""
    return [f"{e.get('source')}: {e.get('message')}" for e in console_log(driver) if e.get("level") == "SEVERE"]


def save_screenshot(driver: WebDriver, name: str) -> Path:
    """The viewport as ``ARTIFACTS/NAME.png``; returns its path."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"a screenshot's name is a plain file name, not {name!r}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    path.write_bytes(driver.get_screenshot_as_png())
    return path


def wait_for(driver: WebDriver, predicate: str | Callable[[WebDriver], Any], what: str, timeout: float = 60.0) -> Any:
    """Polls ``predicate`` until it is truthy and returns its value. A string is a JavaScript expression evaluated in
    the page; a callable is called with the driver. A JavaScript error while polling (the element not there yet)
    counts as not yet. ``timeout`` only bounds a failure, which names ``what`` and shows the last error, the console
    log and the start of the page's text."""
    from selenium.common.exceptions import (
        JavascriptException,
        StaleElementReferenceException,
        TimeoutException,
        WebDriverException,
    )
    from selenium.webdriver.support.wait import WebDriverWait

    check: Callable[[WebDriver], Any]
    if isinstance(predicate, str):
        script = f"return (\n{predicate}\n);"

        def evaluate(d: WebDriver) -> Any:
            return d.execute_script(script)

        check = evaluate
    else:
        check = predicate
    last_error: list[WebDriverException] = []

    def attempt(d: WebDriver) -> Any:
        try:
            return check(d)
        except (JavascriptException, StaleElementReferenceException) as exc:
            last_error[:] = [exc]
            return False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(attempt)
    except TimeoutException:
        error = f"{type(last_error[0]).__name__}: {last_error[0].msg}" if last_error else "none"
        pytest.fail(f"timed out after {timeout:g} s waiting for {what}\nlast error: {error}\n{page_state(driver)}")


def page_state(driver: WebDriver) -> str:
    """The page's address, console log and first 2000 characters of text, for a failure message; what cannot be read
    (the browser gone) says so instead."""
    from selenium.common.exceptions import WebDriverException

    parts = []
    try:
        parts.append(f"url: {driver.current_url}")
        log = [f"  {e.get('level')} {e.get('source')}: {e.get('message')}" for e in console_log(driver)]
        parts.append("console log:" + ("\n" + "\n".join(log) if log else " (empty)"))
        text = driver.execute_script("return document.body ? document.body.innerText : '';")
        parts.append(f"page text (first 2000 characters):\n{str(text)[:2000]}")
    except WebDriverException as exc:
        parts.append(f"(the rest could not be read: {exc.msg})")
    return "\n".join(parts)
