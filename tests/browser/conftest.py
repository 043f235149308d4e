"""``browser_factory``: opens headless Chromium at a viewport size, as ``with browser_factory(390, 844) as driver:``
(tests/browser/chromium.py). Skips the test, with a reason tests/conftest.py groups as ``chromium``, where chromium,
chromedriver or selenium is missing."""

from __future__ import annotations

import pytest

from tests.browser.chromium import BrowserFactory, missing_browser, open_browser


@pytest.fixture
def browser_factory() -> BrowserFactory:
    reason = missing_browser()
    if reason is not None:
        pytest.skip(reason)
    return open_browser
