"""The one language-modelling loss (largetrain_core.training.loss), used by the training step, the
evaluation during training and the held-out perplexity: next-token cross-entropy in nats, computed
in fp32 whatever the logits' dtype."""

import math

import pytest
import torch

from largetrain_core.model import build_model
from largetrain_core.training.loss import cross_entropy, next_token_loss, targets


def test_uniform_logits_cost_ln_vocabulary_size():
    logits = torch.zeros(2, 5, 320)
    ids = torch.randint(0, 320, (2, 5), generator=torch.Generator().manual_seed(0))
    assert cross_entropy(logits, ids).item() == pytest.approx(math.log(320), abs=1e-6)


def test_half_precision_logits_are_scored_in_fp32():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 7, 300, generator=g) * 20).to(torch.bfloat16)
    ids = torch.randint(0, 300, (2, 7), generator=g)
    loss = cross_entropy(logits, ids)
    assert loss.dtype == torch.float32
    assert loss.item() == torch.nn.functional.cross_entropy(logits.float().reshape(-1, 300), ids.reshape(-1)).item()


def test_sum_over_targets_is_the_mean_and_the_model_reads_all_but_the_last_id():
    model = build_model("llama-tiny", 300, 16, eos_id=0, seed=0).eval()
    batch = torch.randint(0, 300, (3, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        mean = next_token_loss(model, batch)
        total = next_token_loss(model, batch, reduction="sum")
        logits = model(input_ids=batch[:, :-1]).logits
    assert targets(batch) == 3 * 8
    assert torch.allclose(total / targets(batch), mean)
    assert mean.item() == cross_entropy(logits, batch[:, 1:]).item()


def test_held_out_perplexity_is_exp_of_the_same_loss(tmp_path, bpe_dir, sentences):
    """largetrain_core.evaluate.perplexity pools next_token_loss over the split: exp of the mean nats per
    target token of every sequence."""
    import numpy as np
    import polars as pl

    from largetrain_core.evaluate import perplexity
    from largetrain_core.shards import TokenShards, build_token_shards

    docs = tmp_path / "docs"
    docs.mkdir()
    texts = [" ".join(sentences[i : i + 12]) for i in range(0, 240, 4)]
    pl.DataFrame(
        {"doc_id": [f"d{i}" for i in range(len(texts))], "source": ["t"] * len(texts), "text": texts}
    ).write_parquet(docs / "part-00000.parquet")
    out = tmp_path / "shards"
    out.mkdir()
    build_token_shards(docs, bpe_dir, out, seq_len=32, validation_fraction=0.1)
    data = TokenShards(out, "validation")
    model = build_model("llama-tiny", data.manifest["vocab_size"], 32, eos_id=0, seed=0).eval()
    got = perplexity(model, out, max_sequences=None, batch_size=3)
    batch = torch.from_numpy(data.take(np.arange(len(data))).astype(np.int64))
    with torch.no_grad():
        mean = next_token_loss(model, batch).item()
    assert got["tokens"] == targets(batch) and got["sequences"] == len(data)
    assert got["loss_nats"] == pytest.approx(mean, rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(mean), rel=1e-5)
