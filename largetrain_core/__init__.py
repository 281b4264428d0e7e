"""largetrain core: plain Python (no Dagster) for corpus reading, cleaning, dedup, tokenization,
token shards, DeepSpeed training and evaluation."""
