"""A headless Chromium on the web UI (Debian chromium + chromium-driver, through selenium), and the waits and
clicks the browser tests share; a server stopped by its process group."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.processes import group_members

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def wait(predicate, what: str, timeout: float, every: float = 1.0, proc=None, log: Path | None = None):
    """Poll ``predicate`` until it returns a truthy value (returned), or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(every)
    tail = log.read_text(errors="replace")[-4000:] if log and log.exists() else ""
    pytest.fail(f"timed out waiting for {what}\n{tail}")


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGINT, then SIGTERM, then SIGKILL the server's process group, each time waiting until no
    member of the group is left (the leader may exit before its children do)."""
    for sig, patience in ((signal.SIGINT, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + patience
        while time.time() < deadline:
            proc.poll()
            if not group_members(proc.pid):
                return
            time.sleep(0.2)


def chrome(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1600,1000",
    ):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def click_button(driver, label: str, timeout: float, within: str = "") -> None:
    """Click the enabled <button> whose text is ``label`` (inside the element of XPath ``within``, if given),
    retrying while the page re-renders."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    def click():
        try:
            if label != "Skip":  # the community dialog can appear late, over the page, and take the click
                for skip in driver.find_elements(By.XPATH, "//button[normalize-space(.)='Skip']"):
                    if skip.is_displayed() and skip.is_enabled():
                        skip.click()
                        return False
            for b in driver.find_elements(By.XPATH, f"{within}//button[normalize-space(.)='{label}']"):
                if b.is_displayed() and b.is_enabled():
                    b.click()
                    return True
        except WebDriverException:  # stale element, or covered by an overlay that is going away
            return False
        return False

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if click():
            return
        time.sleep(0.5)
    shown = [b.text for b in driver.find_elements(By.TAG_NAME, "button") if b.is_displayed()]
    pytest.fail(
        f"timed out waiting for a clickable {label!r} button; buttons shown: {shown}; "
        f"page: {driver.find_element(By.TAG_NAME, 'body').text[:1500]!r}"
    )


def dismiss_community_dialog(driver) -> None:
    """The first visit shows a "Join the Dagster community" dialog over the page; press its Skip button."""
    from selenium.webdriver.common.by import By

    if driver.find_elements(By.XPATH, "//button[normalize-space(.)='Skip']"):
        click_button(driver, "Skip", 10)


def metadata_cells(driver, key: str, what: str, timeout: float = 120) -> dict:
    """The asset page's metadata table once the row labelled ``key`` shows (the community dialog dismissed):
    each row's label -> its value cell (a WebElement), the rows of tables inside values left out."""
    from selenium.webdriver.common.by import By

    def visible():
        return [e for e in driver.find_elements(By.XPATH, f"//td[normalize-space(.)='{key}']") if e.is_displayed()]

    label = wait(visible, what, timeout)[0]
    time.sleep(2)  # the community dialog opens a moment after the page
    dismiss_community_dialog(driver)
    shown = {}
    for row in label.find_elements(By.XPATH, "./ancestor::table[1]/tbody/tr[td] | ./ancestor::table[1]/tr[td]"):
        cells = row.find_elements(By.XPATH, "./td")
        shown[cells[0].text.strip()] = cells[-1]
    return shown
