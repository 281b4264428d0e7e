"""LoRA's default targets on the architectures transformers ships (tests/cases README: "LoRA on GPT-2"):
every linear layer of the decoder blocks, ``nn.Linear`` or transformers ``Conv1D`` (GPT-2, with PEFT's
``fan_in_fan_out``), the output head never; a model with nothing to adapt by default is refused naming
what LoRA can adapt. Tiny configs built from transformers' config classes, no download."""

import warnings

import pytest
import torch
import transformers
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import LoraLayer
from transformers import AutoModelForCausalLM

from largetrain_core.training.config import LoraSettings
from largetrain_core.training.lora import (
    adaptable_modules,
    add_lora,
    decoder_blocks,
    fan_in_fan_out,
    lora_target_modules,
    target_problems,
)

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 64, "intermediate_size": 64}
GQA = {**SMALL, "num_key_value_heads": 2}
# architecture -> (tiny config, the linear layers of its decoder block as its transformers modeling code names them)
ARCHITECTURES = {
    "llama": (
        lambda: transformers.LlamaConfig(**GQA),
        ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
    ),
    "gpt2": (
        lambda: transformers.GPT2Config(
            n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=64, bos_token_id=0, eos_token_id=0
        ),
        ["c_attn", "c_fc", "c_proj"],
    ),
    "gpt_neox": (
        lambda: transformers.GPTNeoXConfig(**SMALL),
        ["dense", "dense_4h_to_h", "dense_h_to_4h", "query_key_value"],
    ),
    "opt": (
        lambda: transformers.OPTConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            ffn_dim=64,
            vocab_size=64,
            word_embed_proj_dim=32,
        ),
        ["fc1", "fc2", "k_proj", "out_proj", "q_proj", "v_proj"],
    ),
    "qwen2": (
        lambda: transformers.Qwen2Config(**GQA),
        ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
    ),
    "qwen3": (
        lambda: transformers.Qwen3Config(**GQA, head_dim=16),
        ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
    ),
    "mistral": (
        lambda: transformers.MistralConfig(**GQA),
        ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
    ),
    "gemma": (
        lambda: transformers.GemmaConfig(**GQA, head_dim=16),
        ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
    ),
    "phi": (lambda: transformers.PhiConfig(**SMALL), ["dense", "fc1", "fc2", "k_proj", "q_proj", "v_proj"]),
    "falcon": (
        lambda: transformers.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, vocab_size=64),
        ["dense", "dense_4h_to_h", "dense_h_to_4h", "query_key_value"],
    ),
    "bloom": (
        lambda: transformers.BloomConfig(hidden_size=32, n_layer=2, n_head=2, vocab_size=64),
        ["dense", "dense_4h_to_h", "dense_h_to_4h", "query_key_value"],
    ),
    "gptj": (
        lambda: transformers.GPTJConfig(n_embd=32, n_layer=2, n_head=2, vocab_size=64, rotary_dim=8),
        ["fc_in", "fc_out", "k_proj", "out_proj", "q_proj", "v_proj"],
    ),
    # GPT-2's names on nn.Linear layers: fan_in_fan_out follows the layer type, not the name
    "gpt_bigcode": (
        lambda: transformers.GPTBigCodeConfig(n_embd=32, n_layer=2, n_head=2, vocab_size=64),
        ["c_attn", "c_fc", "c_proj"],
    ),
    "mpt": (
        lambda: transformers.MptConfig(d_model=32, n_layers=2, n_heads=2, vocab_size=64),
        ["Wqkv", "down_proj", "out_proj", "up_proj"],
    ),
}


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_default_targets_are_every_linear_layer_of_the_decoder_blocks(arch):
    """The discovered targets are the block's linear layers; PEFT adapts each of them in both blocks (and
    nothing else, not the head), without its fan_in_fan_out warning; the adapted model (lora_B made
    non-zero, as after training) merges into the base weights with the same logits, which a wrong
    fan_in_fan_out would not give."""
    config, expected = ARCHITECTURES[arch]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(), dtype=torch.float32).eval()
    assert len(decoder_blocks(model)) == 2
    targets = lora_target_modules(model)
    assert targets == expected
    assert fan_in_fan_out(model, targets) is (arch == "gpt2")
    assert target_problems(model, LoraSettings()) == []
    ids = torch.randint(0, 64, (2, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # PEFT's "fan_in_fan_out is set to ..." is a UserWarning
        peft_model, used = add_lora(model, LoraSettings(r=2, lora_alpha=4.0), activation_checkpointing=False)
    assert used == targets and peft_model.peft_config["default"].fan_in_fan_out is (arch == "gpt2")
    adapted = sorted(n for n, m in peft_model.named_modules() if hasattr(m, "lora_A") and m.lora_A)
    blocks = tuple(f"base_model.model.{b}." for b in decoder_blocks(model))
    assert adapted and all(n.startswith(blocks) for n in adapted)
    assert sorted({n.rsplit(".", 1)[-1] for n in adapted}) == expected
    assert len(adapted) == 2 * sum(
        1
        for n, _ in model.named_modules()
        if n.startswith(blocks[0][len("base_model.model.") :]) and n.rsplit(".", 1)[-1] in expected
    )
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    with torch.no_grad():
        unmerged = peft_model(input_ids=ids).logits
        merged = peft_model.merge_and_unload()(input_ids=ids).logits
    assert (merged - unmerged).abs().max() <= 1e-5 * unmerged.abs().max()


class _ConvBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 4, 3)


class _NothingLinear(torch.nn.Module):
    """Decoder blocks (an nn.ModuleList) holding only a Conv1d, beside an embedding: nothing linear to adapt."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.layers = torch.nn.ModuleList(_ConvBlock() for _ in range(2))


def test_nothing_to_adapt_by_default_is_refused_naming_what_lora_can_adapt():
    model = _NothingLinear()
    assert decoder_blocks(model) == ["layers.0", "layers.1"]
    assert adaptable_modules(model) == {"conv": ["Conv1d"], "embed": ["Embedding"]}
    msg = (
        "no nn.Linear or Conv1D layer inside its 2 decoder blocks of _NothingLinear to adapt by default; set "
        "lora.target_modules to some of the modules LoRA can adapt: conv (Conv1d), embed (Embedding)"
    )
    with pytest.raises(ValueError) as e:
        lora_target_modules(model)
    assert str(e.value) == msg
    assert target_problems(model, LoraSettings()) == [msg]
    assert target_problems(model, LoraSettings(target_modules=["proj"])) == [
        "lora.target_modules ['proj'] match no module of the base model; LoRA can adapt conv (Conv1d), embed (Embedding)"
    ]
    # following the advice: a module it names is accepted, and PEFT adapts it in both blocks
    assert target_problems(model, LoraSettings(target_modules=["conv"])) == []
    inject_adapter_in_model(LoraConfig(r=2, target_modules=["conv"]), model)
    assert sorted(n for n, m in model.named_modules() if isinstance(m, LoraLayer)) == ["layers.0.conv", "layers.1.conv"]
