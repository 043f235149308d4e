"""The browser harness itself (tests/browser/chromium.py), on a page served from a loopback ``http.server``: the
viewport is the size asked for, the page's script runs, the Content-Security-Policy the server sends is enforced and
its violation reaches ``console_errors``, a screenshot is a PNG of the viewport, a failed ``wait_for`` says what the
page showed, Selenium Manager is never asked for anything, and once the block is left, normally or by an exception,
no process of the browser and no chromedriver is left running."""

from __future__ import annotations

import base64
import hashlib
import shutil
import struct
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NoReturn

import pytest

from tests.browser.chromium import (
    ARTIFACTS,
    ROOT,
    BrowserFactory,
    artifacts_dir,
    console_errors,
    processes_of,
    save_screenshot,
    wait_for,
)

HASHED_SCRIPT = "document.getElementById('hashed').textContent = 'ran';"
SCRIPT_HASH = base64.b64encode(hashlib.sha256(HASHED_SCRIPT.encode()).digest()).decode()
CSP = f"default-src 'none'; script-src 'sha256-{SCRIPT_HASH}'"
# The un-hashed script comes first: once the hashed one has run, the browser has had its turn at the other.
PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Harness</title></head>
<body><h1>Harness page</h1><p id="unhashed">untouched</p><p id="hashed">not run</p>
<script>document.getElementById('unhashed').textContent = 'the un-hashed script ran';</script>
<script>{HASHED_SCRIPT}</script>
</body></html>
""".encode()
SIZES = {"phone": (390, 844), "desktop": (1366, 900)}


class PageHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path != "/":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the test's output, not a request log


@pytest.fixture
def page_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), PageHandler)
    thread = threading.Thread(target=server.serve_forever, name="harness-page", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(autouse=True)
def no_selenium_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Selenium Manager would download a driver or a browser; the harness hands selenium both paths instead."""
    try:
        from selenium.webdriver.common.selenium_manager import SeleniumManager
    except ImportError:
        return  # the browser tests skip

    def refuse(*_: object) -> NoReturn:
        raise AssertionError("Selenium Manager was asked for a driver or a browser")

    monkeypatch.setattr(SeleniumManager, "binary_paths", refuse)


def running(profile: str) -> list[str]:
    """The processes with ``--user-data-dir=PROFILE`` in their command line, by ``pgrep -f`` (or, without procps,
    the harness's own /proc scan)."""
    assert all(c.isalnum() or c in "/_-." for c in profile), profile  # a plain path, safe as a pgrep pattern
    if shutil.which("pgrep") is None:
        return [str(pid) for pid in processes_of(Path(profile))]
    proc = subprocess.run(
        ["pgrep", "-f", "--", f"--user-data-dir={profile}( |$)"], capture_output=True, text=True, check=False
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: none matched
    return proc.stdout.split()


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, which comes first, after the 8-byte signature."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    _, chunk, width, height = struct.unpack(">I4sII", data[8:24])
    assert chunk == b"IHDR"
    return width, height


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_page_at_the_asked_size_runs_its_script_under_the_csp(
    browser_factory: BrowserFactory, page_url: str, size: tuple[int, int]
) -> None:
    width, height = size
    with browser_factory(width, height) as driver:
        profile = driver.capabilities["chrome"]["userDataDir"]
        service = driver.service
        assert running(profile), "no browser process found: the check after the block would prove nothing"
        driver.get(page_url)
        wait_for(driver, "document.getElementById('hashed').textContent === 'ran'", "the hashed script to run")
        viewport = driver.execute_script("return [window.innerWidth, window.innerHeight, window.devicePixelRatio];")
        assert viewport == [width, height, 1]
        assert driver.execute_script("return document.getElementById('unhashed').textContent;") == "untouched"

        errors = wait_for(driver, console_errors, "the CSP violation in the console log")
        assert len(errors) == 1, errors
        assert errors[0].startswith("security: ") and "Content Security Policy" in errors[0], errors
        assert console_errors(driver) == errors  # read once from chromedriver, kept for the next call

        shot = save_screenshot(driver, f"harness-{width}x{height}")
        assert shot.parent == ARTIFACTS and shot.name == f"harness-{width}x{height}.png"
        assert png_size(shot.read_bytes()) == (width, height)

        with pytest.raises(pytest.fail.Exception) as failed:
            wait_for(driver, "document.title === 'never'", "a title the page never gets", timeout=0.5)
        message = str(failed.value)
        assert "waiting for a title the page never gets" in message
        assert "Harness page" in message and "untouched" in message  # the page's text
        assert "Content Security Policy" in message  # the console log
    assert service.process.poll() is not None, "chromedriver still running"
    assert running(profile) == []
    assert not Path(profile).exists()


def test_leaving_by_an_exception_still_ends_the_browser_and_chromedriver(browser_factory: BrowserFactory) -> None:
    with pytest.raises(RuntimeError, match="the test body failed"), browser_factory(390, 844) as driver:
        profile = driver.capabilities["chrome"]["userDataDir"]
        service = driver.service
        assert running(profile)
        raise RuntimeError("the test body failed")
    assert service.process.poll() is not None, "chromedriver still running"
    assert running(profile) == []
    assert not Path(profile).exists()


def test_artifacts_go_under_the_directory_the_environment_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NVDAEMON_TEST_ARTIFACTS", str(tmp_path))
    assert artifacts_dir() == tmp_path / "browser"
    monkeypatch.delenv("NVDAEMON_TEST_ARTIFACTS")
    assert artifacts_dir() == ROOT / "test-artifacts" / "browser"
