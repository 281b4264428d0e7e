"""Issue 42 item 7: a version whose blocking check failed is never an input of a later run. The handle IO
manager (largetrain_dagster.resources) refuses it, naming the version, the run that made it and the check,
until the asset is materialized again and passes; the run config's ``checks`` resource waives a check
by name (with a warning); a failed check that is not blocking stops nothing. Two small assets here (a
version directory sealed with its manifest, as every stage seals one); the real case, a lora_adapter on
a diverged base_checkpoint, is in test_training_health.py."""

from dagster import AssetCheckResult, AssetCheckSpec, DagsterInstance, Output, asset, materialize

from largetrain_core.storage import write_manifest
from largetrain_dagster.resources import CheckWaivers, HandleIOManager


def test_a_failed_blocking_check_stops_later_runs_until_rebuilt_or_waived(tmp_path):
    version = tmp_path / "root" / "upstream" / "v1"
    version.mkdir(parents=True)
    (version / "data.txt").write_text("made")
    write_manifest(version)
    verdict = {"passed": False}

    @asset(
        check_specs=[
            AssetCheckSpec("sound", asset="upstream", blocking=True),
            AssetCheckSpec("advisory", asset="upstream", blocking=False),
        ]
    )
    def upstream():
        yield Output({"path": str(version), "data_version": "v1", "stats": {}})
        yield AssetCheckResult(
            check_name="sound", passed=verdict["passed"], description=None if verdict["passed"] else "loss rose"
        )
        yield AssetCheckResult(check_name="advisory", passed=False, description="only a note")

    @asset
    def downstream(upstream: dict) -> dict:
        return upstream

    resources = {"io_manager": HandleIOManager(root=str(tmp_path / "root")), "checks": CheckWaivers()}

    def run(instance, selection, **kw):
        return materialize([upstream, downstream], instance=instance, resources=resources, selection=selection, **kw)

    with DagsterInstance.ephemeral() as instance:
        made = run(instance, ["upstream"], raise_on_error=False)
        assert not made.success  # its blocking check failed
        refused = run(instance, ["downstream"], raise_on_error=False)
        assert not refused.success and not refused.asset_materializations_for_node("downstream")
        (failure,) = [e for e in refused.all_events if e.is_step_failure]
        message = failure.event_specific_data.error.message
        assert (
            f"upstream version v1 (made by run {made.run_id}) failed its blocking check sound: loss rose. "
            "downstream does not read a version whose blocking check failed" in message
        ), message
        assert 'waive_failed_checks: ["upstream:sound"]' in message and "advisory" not in message

        waiver = {"resources": {"checks": {"config": {"waive_failed_checks": ["upstream:sound"]}}}}
        waived = run(instance, ["downstream"], run_config=waiver)
        assert waived.success
        warnings = [
            e.user_message for e in instance.all_logs(waived.run_id) if "the run config waives it" in e.user_message
        ]
        assert warnings == [
            f"upstream version v1 failed its blocking check sound (run {made.run_id}): loss rose. Used by downstream "
            "all the same: the run config waives it (resources checks waive_failed_checks upstream:sound)"
        ]

        verdict["passed"] = True  # materialized again, and its check passes: used again
        assert run(instance, ["upstream"]).success
        assert run(instance, ["downstream"]).success
