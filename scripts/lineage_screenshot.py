"""Screenshot of the asset lineage in the Dagster web UI, for the README (docs/images/lineage.png).

Starts ``dagster dev -w workspace.yaml`` on 127.0.0.1 (a free port, a throwaway DAGSTER_HOME and
storage root), opens the global asset lineage page ("Lineage") in headless Chromium (Debian
``chromium`` and ``chromium-driver``, driven by selenium) with the lineage's four asset groups
selected and expanded, waits until every stage is drawn, and saves the page as a PNG scaled to ``--width`` pixels with a
palette of 64 colours (a few tens of KiB). The server is stopped by its process group
(SIGINT, then SIGTERM, then SIGKILL).

    python scripts/lineage_screenshot.py docs/images/lineage.png

Raises SystemExit naming what did not appear (the server's log tail is printed) when the page does
not show the lineage within the timeouts.
"""

import argparse
import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from urllib.parse import quote
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the lineage's asset groups, and how often each stage name must be drawn (twice: once per corpus role;
# "tokenizer" names a group and its asset)
GROUPS = ("pretrain_data", "domain_data", "tokenizer", "training")
SELECTION = "not group:landed_data and not group:optimization"
STAGES = {
    "raw_corpus": 2,
    "cleaned_text": 2,
    "deduplicated_text": 2,
    "token_shards": 2,
    "tokenizer": 2,
    "base_checkpoint": 1,
    "lora_adapter": 1,
    "evaluation": 1,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, what: str, timeout: float, log: Path | None, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # the page re-rendering under selenium, or the server not up yet
            value = None
        if value:
            return value
        time.sleep(every)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what() if callable(what) else what}\n{tail}")


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGINT, 20.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; its children may not be
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return


def _chrome(profile: Path, size: tuple[int, int]):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
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
        f"--window-size={size[0]},{size[1]}",
    ):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def screenshot(
    out: Path, url: str | None = None, width: int = 1100, window: tuple[int, int] = (1500, 1700)
) -> tuple[int, int]:
    """Take the screenshot into ``out`` from the webserver at ``url`` (None: start ``dagster dev``);
    returns the saved image's (width, height) in pixels. ``window``: the browser's size; tall enough that
    the graph, fitted to it, is drawn at a zoom where Dagster still writes the assets' names."""
    from PIL import Image

    with tempfile.TemporaryDirectory(prefix="lineage-shot-") as tmp:
        tmp = Path(tmp)
        if url is not None:
            png = _shoot(url, tmp / "profile", window, None)
        else:
            with dagster_dev(tmp) as (url, log):
                png = _shoot(url, tmp / "profile", window, log)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.quantize(colors=64).save(out, optimize=True)
    return image.size


@contextlib.contextmanager
def dagster_dev(tmp: Path):
    """``dagster dev -w workspace.yaml`` on 127.0.0.1 with a throwaway DAGSTER_HOME and storage root under
    ``tmp``; yields (url, log file) once the webserver answers; stops the process group on exit."""
    home, root = tmp / "home", tmp / "root"
    home.mkdir(), root.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    port, log = _free_port(), tmp / "dagster_dev.log"
    env = {**os.environ, "DAGSTER_HOME": str(home), "LARGETRAIN_ROOT": str(root), "LARGETRAIN_WANDB_MODE": "disabled"}
    dagster = str(Path(sys.executable).with_name("dagster"))
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [dagster, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO,
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: urllib.request.urlopen(f"{url}/server_info", timeout=5).status == 200, "the webserver", 240, log)
        yield url, log
    finally:
        _stop_group(proc)


def _shoot(url: str, profile: Path, window: tuple[int, int], log: Path | None) -> bytes:
    driver = _chrome(profile, window)
    try:
        driver.get(f"{url}/asset-groups")  # the left navigation's "Lineage"
        _wait(lambda: "pretrain_data" in _body(driver), "the global asset lineage page", 240, log)
        deadline = time.monotonic() + 5  # the community dialog opens a moment after the first page
        while time.monotonic() < deadline and not _click(driver, "//button[normalize-space(.)='Skip']"):
            time.sleep(0.5)
        # room for the graph: the navigation collapsed (the browser profile keeps it so)
        _wait(lambda: _click(driver, "//button[normalize-space(.)='Hide navigation']"), "'Hide navigation'", 30, log)
        # the lineage's groups (the landed chain and the ablation left out), expanded, fitted on load
        driver.get(
            f"{url}/asset-groups~{quote(SELECTION)}/?expanded={quote(','.join(f'global@global:{g}' for g in GROUPS))}"
        )
        _wait(
            lambda: not _missing(driver),
            lambda: f"every stage of the lineage (drawn fewer times than needed: {_missing(driver)})",
            120,
            log,
        )
        time.sleep(3)  # the graph's zoom-to-fit animation
        # the graph was fitted beside the asset list: hide the list, zoom in one step, centre the graph
        _wait(
            lambda: _click(driver, "//button[.//*[@aria-label='panel_show_right']]"), "the asset list's toggle", 30, log
        )
        _wait(lambda: _click(driver, "//button[.//*[@aria-label='zoom_in']]"), "the zoom-in button", 30, log)
        time.sleep(2)
        _centre(driver)
        time.sleep(2)
        return driver.get_screenshot_as_png()
    finally:
        driver.quit()


def _missing(driver) -> dict[str, int]:
    """The stages of :data:`STAGES` the page shows fewer times than it should: {stage: times shown}."""
    body = _body(driver)
    return {s: body.count(s) for s, n in STAGES.items() if body.count(s) < n}


def _body(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def _click(driver, xpath: str) -> bool:
    """Click the first displayed element matching ``xpath``; False when there is none yet."""
    from selenium.webdriver.common.by import By

    shown = [e for e in driver.find_elements(By.XPATH, xpath) if e.is_displayed()]
    if shown:
        shown[0].click()
    return bool(shown)


def _centre(driver) -> None:
    """Drag the graph's background so that the box around the asset groups is centred in the viewport."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    box = driver.execute_script(
        """
        const names = new Set(arguments[0]);
        const rects = [...document.querySelectorAll('foreignObject div, foreignObject span')]
          .filter(e => names.has(e.textContent.trim()) && e.children.length === 0)
          .map(e => e.getBoundingClientRect()).filter(r => r.width > 0);
        const search = [...document.querySelectorAll('.CodeMirror')].map(e => e.getBoundingClientRect())
          .filter(r => r.width > 0)[0];
        return {x0: Math.min(...rects.map(r => r.left)), x1: Math.max(...rects.map(r => r.right)),
                y0: Math.min(...rects.map(r => r.top)), y1: Math.max(...rects.map(r => r.bottom)) + 40,
                vx0: search.left, vx1: window.innerWidth, vy0: search.bottom + 8, vy1: window.innerHeight};""",
        [*GROUPS, *STAGES],
    )
    dx = round((box["vx0"] + box["vx1"]) / 2 - (box["x0"] + box["x1"]) / 2)
    dy = round((box["vy0"] + box["vy1"]) / 2 - (box["y0"] + box["y1"]) / 2)
    # grab the viewport near the corner the drag moves away from, so that the pointer stays inside
    x = round(box["vx0"]) + 12 if dx > 0 else round(box["vx1"]) - 60
    y = round(box["vy0"]) + 12 if dy > 0 else round(box["vy1"]) - 12
    drag = ActionBuilder(driver)
    drag.pointer_action.move_to_location(x, y).pointer_down().move_to_location(
        x + dx // 2, y + dy // 2
    ).move_to_location(x + dx, y + dy).pointer_up()
    drag.perform()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the PNG to write (docs/images/lineage.png)")
    p.add_argument("--url", help="a running webserver of this code location (default: start dagster dev)")
    p.add_argument("--width", type=int, default=1100, help="width of the saved image in pixels (default 1100)")
    args = p.parse_args(argv)
    w, h = screenshot(args.out, args.url, args.width)
    print(f"{args.out}: {w} x {h} px, {args.out.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
