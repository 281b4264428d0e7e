"""The end-to-end tier: the browser against `dagster dev`, the whole lineage through Dagster, determinism
across runs, the recipes, PostgreSQL. Fixtures of every tier are in tests/conftest.py; the whole lineage,
materialized once, is a fixture of the module that reads it (tests/e2e/test_lineage.py: tiny_lineage)."""
