"""A real browser for tests: Debian's headless chromium driven by Selenium through Debian's
chromedriver (scripts/install-chromium.sh installs both; Selenium never downloads a driver here,
it is given the path). Screenshots go to $TENANTGATE_TEST_ARTIFACTS, else the test's tmp dir."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.utils.tools import missing_tool

ARTIFACTS_ENV = "TENANTGATE_TEST_ARTIFACTS"


def find_chromium() -> tuple[str, str] | None:
    """(chromium, chromedriver), or None when either is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def artifacts_dir(default: Path) -> Path:
    directory = Path(os.environ.get(ARTIFACTS_ENV) or default)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@contextmanager
def chromium(width: int = 1280, height: int = 1000) -> Iterator:
    """A headless chromium WebDriver, quit when the block ends."""
    found = find_chromium()
    if found is None:
        missing_tool("chromium and chromedriver not found: run scripts/install-chromium.sh (make test does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = found
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--no-first-run", "--disable-extensions", f"--window-size={width},{height}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def full_page_screenshot(driver, path: Path) -> Path:
    """The whole page, not only the window: the window grows to the document's height first."""
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, 600)  # a page shorter than the last one is not padded to its height
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(max(height + 120, 600), 6000))
    driver.save_screenshot(str(path))
    return path
