"""The stages of the lineage, one module each, named after the asset: a function taking its settings,
its inputs (:class:`~largetrain_core.stages.base.Artifact`) and a :class:`~largetrain_core.stages.base.StageRun`
(where to write, the log, the executor), returning a :class:`~largetrain_core.stages.base.StageResult`
(output directory, data version, stats, warnings, check results, reused). An orchestrator only reads
its config, calls one stage and reports the result (largetrain_dagster)."""
