"""Materializing the lineage in process the way `make demo` does with the CLI: the partitioned
per-document steps (raw_corpus, cleaned_text) one run per data partition, then one run for the rest."""

from __future__ import annotations

from dagster import AssetKey, materialize

from largetrain_dagster.partitions import DATA_PARTITIONS, PARTITIONED_KEYS

PARTITION_KEYS = DATA_PARTITIONS.get_partition_keys()


def is_partitioned(key: str) -> bool:
    """Whether ``key`` (``role/name``) is one of the main chains' partitioned steps."""
    return AssetKey.from_user_string(key) in PARTITIONED_KEYS


def step_events(instance, run_id: str, step: str) -> list[str]:
    """The event types of step ``step`` in run ``run_id``, in order."""
    return [
        e.dagster_event.event_type_value for e in instance.all_logs(run_id) if e.dagster_event and e.step_key == step
    ]


def step_failure(result) -> tuple[str, dict]:
    """(description, metadata) of the step failure of ``result`` (a :class:`Runs`' last run; a
    dagster.Failure's user data)."""
    (ev,) = [e for e in result.last.all_events if e.is_step_failure]
    user = ev.event_specific_data.user_failure_data
    return user.description, {k: getattr(v, "value", v) for k, v in user.metadata.items()}


class Runs:
    """The results of one materialize() per partition plus the final one, read as one."""

    def __init__(self, results):
        self.results = results

    @property
    def success(self) -> bool:
        return all(r.success for r in self.results)

    @property
    def last(self):
        return self.results[-1]

    @property
    def run_id(self) -> str:
        return self.last.run_id

    def get_asset_check_evaluations(self):
        return [e for r in self.results for e in r.get_asset_check_evaluations()]

    def get_asset_materialization_events(self):
        return [e for r in self.results for e in r.get_asset_materialization_events()]

    def asset_materializations_for_node(self, node: str):
        return [m for r in self.results for m in r.asset_materializations_for_node(node)]

    def output_for_node(self, node: str):
        return self.last.output_for_node(node)


def materialize_lineage(
    assets,
    resources,
    instance,
    run_config: dict,
    selection: list[str] | None = None,
    partitions: list[str] | None = None,
    **kw,
) -> Runs:
    """Materialize ``selection`` (user strings; every asset of ``assets`` when None) with ``run_config``
    cut down to each run's assets: the partitioned keys once per partition in ``partitions`` (all
    when None), then the others in one run. Stops after the first failed run."""
    if selection is None:
        selection = [k.to_user_string() for a in assets if hasattr(a, "keys") for k in a.keys]
    parted = [k for k in selection if is_partitioned(k)]
    rest = [k for k in selection if not is_partitioned(k)]

    def one(keys, **extra):
        ops = {op: c for op, c in run_config.get("ops", {}).items() if op.replace("__", "/") in keys}
        return materialize(
            assets,
            resources=resources,
            instance=instance,
            run_config={"ops": ops},
            selection=[AssetKey.from_user_string(k) for k in keys],
            **kw,
            **extra,
        )

    results = []
    for pk in (partitions or PARTITION_KEYS) if parted else []:
        results.append(one(parted, partition_key=pk))
        if not results[-1].success:
            return Runs(results)
    if rest:
        results.append(one(rest))
    return Runs(results)
