"""The model card generator (largetrain_core.model_card) on its own; through Dagster in tests/e2e/test_lineage.py."""

import json

from huggingface_hub import ModelCard

from largetrain_core.model_card import read_lineage, render_model_card, write_model_card

PROVENANCE = {
    "corpus": "linux-doc",
    "package": "linux-doc-6.1",
    "registry": "debian",
    "version": "6.1.192-3",
    "archive": "linux-doc-6.1_6.1.192-3_all.deb",
    "archive_sha256": "f18d" * 16,
    "files": 3183,
    "bytes": 24157891,
    "content_digest": "ac4c9d57e5a48fe30bfe54a1d3a091e0",
    "fetched_at": "2026-11-30T23:28:22Z",
}


def lineage(kind="base_model", **extra):
    return {
        "kind": kind,
        "data_version": "0123456789abcdef",
        "corpora": [
            {
                "role": "pretrain",
                "source": "/data/corpora/linux-doc",
                "provenance": PROVENANCE,
                "content_digests": {"000": "aa" * 16},
                "documents": {"input": 10, "kept": 7, "filtered": 2, "duplicate": 1, "rejected": 0},
                "data_versions": {"token_shards": "t5", "raw_corpus": {"000": "r1"}, "deduplicated_text": "d3"},
                "shards": {
                    "total_tokens": 12345,
                    "seq_len": 64,
                    "train_sequences": 180,
                    "validation_sequences": 9,
                    "dtype": "uint16",
                },
            }
        ],
        "tokenizer": {
            "vocab_size": 512,
            "eos_id": 0,
            "sha256": "ee" * 32,
            "data_version": "tok1",
            "pretrained_model": None,
        },
        "training": {
            "config": {
                "preset": "llama-tiny",
                "mode": "pretrain",
                "zero_stage": 2,
                "learning_rate": 0.005,
                "max_steps": 12,
            },
            "results": {"steps": 12, "first_loss": 6.25, "last_loss": 5.5, "validation_loss": 5.75},
        },
        "software": {"largetrain": "0.1.0", "commit": "abc123", "torch": "2.13.0"},
        **extra,
    }


def test_base_model_card_names_its_data_tokenizer_training_and_software():
    card = ModelCard(render_model_card(lineage()))
    assert card.data.library_name == "transformers" and card.data.tags == ["largetrain"]
    text = card.text
    assert "linux-doc-6.1 6.1.192-3 from debian, archive `linux-doc-6.1_6.1.192-3_all.deb` sha256" in text
    assert "3,183 files, 24,157,891 bytes, content digest `ac4c9d57e5a48fe30bfe54a1d3a091e0`" in text
    assert "| 10 | 7 | 2 | 1 | 0 |" in text  # read / kept / filtered / duplicates / rejected
    assert (
        text.index("- raw_corpus: 000: `r1`")
        < text.index("- deduplicated_text: `d3`")
        < text.index("- token_shards: `t5`")
    )
    assert "12,345 tokens at sequence length 64 (180 training and 9 validation sequences, uint16)" in text
    assert (
        "vocabulary 512, EOS id 0" in text and "| preset | llama-tiny |" in text and "| learning_rate | 0.005 |" in text
    )
    assert "| last_loss | 5.5 |" in text and "| validation_loss | 5.75 |" in text
    assert "| training perplexity (exp of the last logged training loss) | 244.7 |" in text  # e^5.5 = 244.69
    assert "largetrain 0.1.0 (commit `abc123`)" in text


def test_adapter_card_keeps_peft_metadata_and_embeds_the_base_lineage(tmp_path):
    base = lineage(imported={"from": "/models/llama", "content_digest": "cd" * 16}, training=None)
    adapter = lineage("lora_adapter", base=base)
    adapter["corpora"][0].update(role="domain", provenance=None, source="/home/me/plays")
    adapter["training"]["config"]["mode"] = "lora"
    adapter["training"]["adapter"] = {"r": 4, "lora_alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
    peft_card = "---\nbase_model: /root/base/model\nlibrary_name: peft\ntags:\n- lora\n- transformers\n---\n\n# Model Card for Model ID\n"
    (tmp_path / "README.md").write_text(peft_card)
    path = write_model_card(tmp_path, adapter)
    card = ModelCard.load(path)
    assert card.data.library_name == "peft" and card.data.base_model == "/root/base/model"
    assert card.data.tags == ["largetrain", "lora", "transformers"]
    assert "Model Card for Model ID" not in card.text and "# LoRA adapter made by largetrain" in card.text
    assert "`/home/me/plays` (no provenance file: identified by the content digests of the files read)" in card.text
    assert "| preset |" not in card.text  # a LoRA run's preset setting is not its model
    assert "LoRA: r=4, lora_alpha=8, target modules `q_proj`, `v_proj`" in card.text
    base_part = card.text[card.text.index("## Base model") :]
    assert "imported from `/models/llama`" in base_part and "linux-doc-6.1 6.1.192-3" in base_part
    assert read_lineage(tmp_path) == json.loads(json.dumps(adapter))
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, nothing left behind


def test_unknown_facts_say_unknown():
    text = ModelCard(render_model_card({"kind": "base_model", "corpora": [{"role": "pretrain"}]})).text
    assert "| unknown | unknown | unknown | unknown | unknown |" in text and "vocabulary unknown" in text


def test_a_diverged_trainings_huge_last_loss_renders_as_infinite_perplexity():
    """A training that collapsed (issue 42 item 7) ended at a loss of 2e6 nats: exp() of it overflows a
    float, which failed the card and retried the whole training."""
    diverged = lineage()
    diverged["training"]["results"].update(last_loss=2.0e6)
    text = ModelCard(render_model_card(diverged)).text
    assert "| training perplexity (exp of the last logged training loss) | inf |" in text
