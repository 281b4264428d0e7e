"""Dagster wiring for largetrain: assets, checks, resources and jobs around largetrain_core."""
