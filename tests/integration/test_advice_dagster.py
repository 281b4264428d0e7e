"""The training assets' refusals that give advice, with the advice followed through Dagster until the
asset succeeds (issue 23 item 7): importing a model directory whose own tokenizer has added tokens
beyond its embedding (the cause named, resized as the message shows), whose tokenizer the shards do not
use, whose positions are shorter than the shards' sequences; a LoRA adapter on domain shards made with
another tokenizer than its base model's. The checks before launch: tests/unit/test_advice.py."""

from pathlib import Path

from dagster import AssetKey, DagsterInstance

from largetrain_core.model import build_model
from largetrain_dagster.definitions import build_definitions, lineage_assets
from largetrain_dagster.resources import read_handle
from helpers.corpora import CORPORA, SHORT_RUN, corpus, tiny_run_config
from helpers.lineage import materialize_lineage, step_events, step_failure
from helpers.training import someones_tokenizer


def test_import_and_adapter_refusals_followed_until_they_succeed(tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    corpus("linux-doc"), corpus("shakespeare")
    src = tmp_path / "someones_model"  # its tokenizer: 300 ids and two added tokens; its embedding: 300 rows
    src.mkdir()
    bos, eos = someones_tokenizer(src)
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.add_tokens(["<tool>", "</tool>"])
    tok.save(str(src / "tokenizer.json"))
    build_model("llama-tiny", 300, 16, eos_id=eos, bos_id=bos, seed=3).save_pretrained(src)

    root = tmp_path / "root"
    defs = build_definitions(root=str(root), nproc_per_node=1, wandb_mode="disabled", report_to=[])
    assets = lineage_assets()
    ops = tiny_run_config(CORPORA)["ops"]
    prep = {k: v for k, v in ops.items() if k.startswith(("pretrain__", "domain__")) or k == "tokenizer"}
    lora = {
        "max_steps": 4,
        "warmup_steps": 1,
        "save_steps": 4,
        "logging_steps": 2,
        "micro_batch_size": 2,
        "learning_rate": 1e-2,
        "eval_strategy": "no",
        "lora": {"r": 2, "lora_alpha": 4.0},
        **SHORT_RUN["health"],
    }

    def run(instance, selection: list[str], **configs):
        return materialize_lineage(
            assets,
            defs.resources,
            instance,
            {"ops": {k: {"config": v} for k, v in configs.items()}},
            selection,
            raise_on_error=False,
        )

    def refused(instance, result, step: str) -> str:
        """The failure's description; the step failed once, not retried (the advice needs a change first)."""
        assert not result.success
        description, _ = step_failure(result)
        events = step_events(instance, result.run_id, step)
        assert "STEP_UP_FOR_RETRY" not in events and events.count("STEP_FAILURE") == 1
        return description

    with DagsterInstance.ephemeral() as instance:
        assert materialize_lineage(
            assets,
            defs.resources,
            instance,
            {"ops": prep},
            [k.replace("__", "/") for k in prep]
            + [f"{r}/{s}" for r in ("pretrain", "domain") for s in ("cleaned_text", "deduplicated_text")]
            + ["relevance_classifier", "evaluation_sets", "pretrain/filtered_text"],
        ).success

        # 1. the directory's own tokenizer exceeds its embedding: the cause and the fix, no tokenizer setting
        description = refused(
            instance,
            run(instance, ["base_checkpoint"], base_checkpoint={"pretrained_model": str(src)}),
            "base_checkpoint",
        )
        assert (
            f"base_checkpoint cannot import {src}: its own tokenizer (tokenizer.json) has ids up to 301, but the "
            "model's embedding has only 300 rows"
        ) in description
        assert "ids 300..301 ('<tool>', '</tool>') have no embedding" in description
        assert "m.resize_token_embeddings(len(AutoTokenizer.from_pretrained(d)))" in description
        assert "pretrained_model to" not in description  # not the directory it already names
        d = str(src)  # followed as written
        m = AutoModelForCausalLM.from_pretrained(d)
        m.resize_token_embeddings(len(AutoTokenizer.from_pretrained(d)))
        m.save_pretrained(d)

        # 2. the shards were made with another tokenizer: "Set the tokenizer asset's pretrained_model to <src>"
        description = refused(
            instance,
            run(instance, ["base_checkpoint"], base_checkpoint={"pretrained_model": str(src)}),
            "base_checkpoint",
        )
        assert "pretrain/token_shards do not use its tokenizer" in description
        assert f"Set the tokenizer asset's pretrained_model to {src} and re-materialize the shards." in description
        assert run(
            instance,
            ["tokenizer", "pretrain/token_shards"],
            tokenizer={"pretrained_model": str(src)},
            pretrain__token_shards=ops["pretrain__token_shards"]["config"],
        ).success

        # 3. the model takes 16 positions: "set the token_shards' seq_len to at most 16 (both corpora)"
        description = refused(
            instance,
            run(instance, ["base_checkpoint"], base_checkpoint={"pretrained_model": str(src)}),
            "base_checkpoint",
        )
        assert "set the token_shards' seq_len to at most 16 (both corpora) and re-materialize them" in description
        short = {"seq_len": 16, "validation_fraction": 0.1}
        assert run(
            instance,
            ["pretrain/token_shards", "domain/token_shards"],
            pretrain__token_shards=short,
            domain__token_shards=short,
        ).success
        imported = run(instance, ["base_checkpoint"], base_checkpoint={"pretrained_model": str(src)})
        assert imported.success
        base_dir = read_handle(root, AssetKey("base_checkpoint"))["stats"]["output"]

        # 4. the domain shards re-made with another tokenizer (a BPE trained here): the adapter is refused,
        # "materialize tokenizer with pretrained_model <the base model>, then domain/token_shards"
        assert run(
            instance,
            ["tokenizer", "domain/token_shards"],
            tokenizer=ops["tokenizer"]["config"],
            domain__token_shards=short,
        ).success
        description = refused(instance, run(instance, ["lora_adapter"], lora_adapter=lora), "lora_adapter")
        assert (
            f"Tokenize the domain corpus with the base model's tokenizer: materialize tokenizer with pretrained_model "
            f"{base_dir}, then domain/token_shards"
        ) in description
        assert run(
            instance,
            ["tokenizer", "domain/token_shards"],
            tokenizer={"pretrained_model": base_dir},
            domain__token_shards=short,
        ).success
        adapted = run(instance, ["lora_adapter"], lora_adapter=lora)
        assert adapted.success
        assert Path(
            read_handle(root, AssetKey("lora_adapter"))["stats"]["output"], "adapter_model.safetensors"
        ).exists()
