"""The unit tier: core functions (largetrain_core, and the pure functions of largetrain_dagster) on tiny
inputs built in the test or taken from tests/cases, seconds each; no Dagster run, no torchrun, no Spark,
no server. `make test-fast` runs this tier alone. Its fixtures are those of tests/conftest.py."""
