"""Issue 15, fault 1: every key under a run config's ``ops`` applies to a step of the run, names a step
the run did not select (allowed, said once in the run log), or fails the run before any step's body
runs, naming the valid steps and the ``__`` spelling of an asset key written with ``/``. The executor's
run config: the multiprocess executor forks its steps from a forkserver unless the run chooses."""

import os
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterEventType, definitions, execute_job, instance_for_test, validate_run_config
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.errors import DagsterUserCodeExecutionError

from largetrain_dagster.configs import RunConfigError, check_ops_keys
from largetrain_dagster.resources import handle_file

STEPS = {"domain__raw_corpus", "domain__cleaned_text", "tokenizer", "lora_adapter"}


def test_rule_applies_allows_unselected_and_names_misspellings():
    selected = {"domain__raw_corpus", "domain__cleaned_text"}
    cfg = {"ops": {"domain__raw_corpus": {"config": {}}, "lora_adapter": {"config": {}}}}
    assert check_ops_keys(cfg, selected, STEPS) == ["lora_adapter"]
    assert check_ops_keys({}, selected, STEPS) == [] and check_ops_keys(None, selected, STEPS) == []
    with pytest.raises(RunConfigError) as e:
        check_ops_keys({"ops": {"domain/raw_corpus": {}, "lora_adaptor": {}, "nothing_like_it": {}}}, selected, STEPS)
    msg = str(e.value)
    assert "3 key(s)" in msg and "'domain/raw_corpus': write 'domain__raw_corpus'" in msg
    assert "'lora_adaptor': no such step (did you mean 'lora_adapter'?);" in msg
    assert "'nothing_like_it': no such step." in msg
    with pytest.raises(RunConfigError) as e:  # a suggestion ends the list: no "?." before the next sentence
        check_ops_keys({"ops": {"lora_adaptor": {}}}, selected, STEPS)
    assert "'lora_adaptor': no such step (did you mean 'lora_adapter'?). Steps of this run:" in str(e.value)
    assert "?." not in str(e.value)
    assert "Steps of this run: domain__cleaned_text, domain__raw_corpus." in msg
    assert "Every step: domain__cleaned_text, domain__raw_corpus, lora_adapter, tokenizer." in msg


@definitions
def code_location():
    """The code location, storage root from LARGETRAIN_TEST_ROOT (loaded again where the job is reconstructed)."""
    from largetrain_dagster.definitions import build_definitions

    return build_definitions(root=os.environ["LARGETRAIN_TEST_ROOT"], wandb_mode="disabled")


def _materialize_as_the_cli(tmp_path, monkeypatch, keys: list[str], run_config: dict):
    """What `dagster asset materialize --select KEYS --partition 000 -c CONFIG` does (dagster._cli.asset:
    execute_job of the code location's implicit asset job with an asset selection), with the in-process
    executor. Returns (success, user log messages, materialized keys, the error raised or None)."""
    monkeypatch.setenv("LARGETRAIN_TEST_ROOT", str(tmp_path / "root"))
    job = ReconstructableRepository.for_file(__file__, "code_location").get_reconstructable_job("__ASSET_JOB")
    run_config = {**run_config, "execution": {"config": {"in_process": {}}}}
    with instance_for_test() as instance:
        error, success = None, False
        try:
            with execute_job(
                job,
                instance,
                run_config=run_config,
                tags={"dagster/partition": "000"},
                asset_selection=[AssetKey.from_user_string(k) for k in keys],
            ) as result:
                success = result.success
        except DagsterUserCodeExecutionError as e:  # the in-process executor raises a resource's failure
            error = e
        (run,) = instance.get_runs()
        logs = [e.user_message for e in instance.all_logs(run.run_id) if e.dagster_event is None]
        done = {
            e.dagster_event.asset_key.to_user_string()
            for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
        }
        return success, logs, done, error


def _corpus(tmp_path, cases) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "docs.jsonl").write_bytes((cases / "short_docs.jsonl").read_bytes())
    return corpus


def test_a_misspelled_step_fails_the_run_before_any_work(tmp_path, monkeypatch, cases):
    """The CLI's path, which dropped such keys: the run fails in the storage resource's setup, before
    raw_corpus reads anything (not even the default corpus), and says how to spell the key."""
    cfg = {"ops": {"domain/raw_corpus": {"config": {"path": str(_corpus(tmp_path, cases))}}}}
    ok, logs, done, error = _materialize_as_the_cli(tmp_path, monkeypatch, ["domain/raw_corpus"], cfg)
    assert not ok and not done and error is not None
    msg = str(error.__cause__)
    assert "'domain/raw_corpus': write 'domain__raw_corpus'" in msg and "Steps of this run: domain__raw_corpus." in msg
    assert "Every step: base_checkpoint, domain__cleaned_text," in msg
    assert not handle_file(tmp_path / "root", AssetKey(["domain", "raw_corpus"]), "000").exists()
    assert not (tmp_path / "root" / "domain").exists()


def test_unselected_steps_config_is_allowed_and_logged_once(tmp_path, monkeypatch, cases):
    """One recipe file for every run: the keys of steps the run does not select are allowed, and the
    run log says once (not once per step) that this run does not use them."""
    cfg = {
        "ops": {
            "domain__raw_corpus": {"config": {"path": str(_corpus(tmp_path, cases))}},
            "domain__cleaned_text": {"config": {"gopher_quality": False}},
            "tokenizer": {"config": {"vocab_size": 512}},
            "pretrain__cleaned_text": {"config": {"c4": True}},
        }
    }
    ok, logs, done, error = _materialize_as_the_cli(
        tmp_path, monkeypatch, ["domain/raw_corpus", "domain/cleaned_text"], cfg
    )
    assert ok and error is None and done == {"domain/raw_corpus", "domain/cleaned_text"}
    assert [m for m in logs if "not used by it" in m] == [
        "run config for steps outside this run, not used by it: pretrain__cleaned_text, tokenizer "
        "(they apply to the runs that select those steps)"
    ]


def test_the_demo_driver_refuses_a_misspelled_step_instead_of_cutting_it():
    """`python -m largetrain_dagster.demo -c FILE` cuts the config down to each job's steps: a key that
    names no step is an error there too, not a key silently cut away."""
    from largetrain_dagster.demo import job_config

    cfg = {"ops": {"domain__raw_corpus": {"config": {"path": "x"}}, "lora_adapter": {"config": {}}}, "execution": {}}
    assert job_config(cfg, {"domain__raw_corpus"}, STEPS) == {
        "ops": {"domain__raw_corpus": {"config": {"path": "x"}}},
        "execution": {},
    }
    with pytest.raises(RunConfigError, match="'domain/raw_corpus': write 'domain__raw_corpus'"):
        job_config({"ops": {"domain/raw_corpus": {}}}, {"domain__raw_corpus"}, STEPS)


def test_the_demo_driver_takes_a_graph_backed_assets_key():
    """GraphQL lists a graph-backed asset's ops as graph.op; its run config key is the graph's name."""
    from largetrain_dagster.demo import config_nodes, job_config

    ops = [
        "pretrain__token_shards.pretrain__token_shards_plan",
        "pretrain__token_shards.pretrain__token_shards_assemble",
    ]
    nodes = config_nodes(ops)
    assert nodes == {*ops, "pretrain__token_shards"}
    cfg = {"ops": {"pretrain__token_shards": {"config": {"seq_len": 64}}}}
    assert job_config(cfg, nodes, nodes) == cfg
    with pytest.raises(RunConfigError, match="'pretrain__token_shard': no such step"):
        job_config({"ops": {"pretrain__token_shard": {}}}, nodes, nodes)


def test_the_multiprocess_executor_forks_its_steps_from_a_forkserver_unless_the_run_chooses():
    from largetrain_dagster.definitions import build_definitions

    job = build_definitions(root="unused").get_job_def("prepare_partitions")

    def executor(execution: dict | None) -> dict:
        run_config = {"execution": {"config": execution}} if execution is not None else {}
        return validate_run_config(job, run_config)["execution"]["multi_or_in_process_executor"]

    assert executor(None)["multiprocess"]["start_method"] == {"forkserver": {}}
    assert executor({"multiprocess": {"max_concurrent": 1}})["multiprocess"]["start_method"] == {"forkserver": {}}
    spawn = {"multiprocess": {"start_method": {"spawn": {}}}}
    assert executor(spawn)["multiprocess"]["start_method"] == {"spawn": {}}
    assert list(executor({"in_process": {}})) == ["in_process"]  # the recipes' configs choose it


def test_a_partitioned_run_with_a_global_step_is_refused_before_any_step(tmp_path, monkeypatch, cases):
    """Issue 42 item 11: `--partition 000 --select 'domain/raw_corpus,domain/cleaned_text,domain/deduplicated_text'`
    crashed in deduplicated_text (`TypeError: string indices must be integers`: it was handed partition
    000's handle alone). The run now fails in the storage resource's setup, before raw_corpus reads
    anything, naming the global step and saying to run it without --partition."""
    cfg = {"ops": {"domain__raw_corpus": {"config": {"path": str(_corpus(tmp_path, cases))}}}}
    keys = ["domain/raw_corpus", "domain/cleaned_text", "domain/deduplicated_text"]
    ok, logs, done, error = _materialize_as_the_cli(tmp_path, monkeypatch, keys, cfg)
    assert not ok and not done and error is not None
    msg = str(error.__cause__)
    assert "this run is of partition 000, but it selects the global step(s) domain__deduplicated_text" in msg
    assert "(domain__cleaned_text, domain__raw_corpus in this run)" in msg
    assert "then the global steps in a run without --partition" in msg
    assert not (tmp_path / "root" / "domain").exists()
    # the per-partition steps alone still run as before
    ok, _, done, error = _materialize_as_the_cli(tmp_path, monkeypatch, keys[:2], cfg)
    assert ok and error is None and done == set(keys[:2])
