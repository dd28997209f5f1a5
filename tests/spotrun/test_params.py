"""Exact parameter counts from HF configs, checked by hand for published models and against transformers."""

from __future__ import annotations

import pytest

from spotrun.contract.spec import RunValidationError
from spotrun.planner.params import lora_parameters, shape_of

LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "vocab_size": 32000}
MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000}
QWEN2_05B = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}
GPT2_SMALL = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
              "n_positions": 1024}


def test_llama2_7b():
    # per layer: attention 4 * 4096^2 = 67,108,864; MLP 3 * 4096 * 11008 = 135,266,304; 2 norms 8,192
    per_layer = 67_108_864 + 135_266_304 + 8_192
    # embeddings 32000 * 4096 = 131,072,000, untied head the same, final norm 4,096
    assert shape_of(LLAMA2_7B).total == 32 * per_layer + 2 * 131_072_000 + 4_096 == 6_738_415_616


def test_mistral_7b_with_grouped_query_attention():
    # q, o: 4096^2 each; k, v: 4096 * (8 * 128) = 4,194,304 each; MLP 3 * 4096 * 14336; norms 2 * 4096
    per_layer = 2 * 16_777_216 + 2 * 4_194_304 + 3 * 58_720_256 + 8_192
    assert shape_of(MISTRAL_7B).total == 32 * per_layer + 2 * 131_072_000 + 4_096 == 7_241_732_096


def test_qwen2_05b_with_qkv_bias_and_tied_embeddings():
    # q: 896*896 + 896; k, v: 896*128 + 128 each; o: 896*896; MLP 3 * 896 * 4864; norms 2 * 896
    per_layer = (802_816 + 896) + 2 * (114_688 + 128) + 802_816 + 3 * 4_358_144 + 1_792
    assert shape_of(QWEN2_05B).total == 24 * per_layer + 151_936 * 896 + 896 == 494_032_768


def test_gpt2_small():
    # c_attn 768*2304+2304, c_proj 768*768+768, c_fc 768*3072+3072, c_proj 3072*768+768, 2 layer norms 4*768
    per_layer = 1_771_776 + 590_592 + 2_362_368 + 2_360_064 + 3_072
    assert shape_of(GPT2_SMALL).total == 12 * per_layer + 50257 * 768 + 1024 * 768 + 1_536 == 124_439_808


def test_lora_rank16_all_linear_on_llama2_7b():
    # q,k,v,o: 4 * 16 * (4096+4096); gate, up: 2 * 16 * (4096+11008); down: 16 * (11008+4096)
    per_layer = 4 * 131_072 + 2 * 241_664 + 241_664
    assert lora_parameters(shape_of(LLAMA2_7B), 16, "all-linear") == 32 * per_layer == 39_976_960


def test_lora_on_named_modules_only():
    # q_proj and v_proj of Mistral: 8 * (4096+4096) + 8 * (4096+1024) per layer at rank 8
    assert lora_parameters(shape_of(MISTRAL_7B), 8, ("q_proj", "v_proj")) == 32 * (65_536 + 40_960) == 3_407_872


def test_unknown_lora_target_names_the_field():
    with pytest.raises(RunValidationError) as err:
        lora_parameters(shape_of(MISTRAL_7B), 8, ("q_proj", "query"))
    assert err.value.field == "training.lora.target_modules" and '"query"' in str(err.value)


@pytest.mark.parametrize("config", [
    {"model_type": "llama", "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3,
     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300},
    {"model_type": "llama", "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 2,
     "num_attention_heads": 4, "vocab_size": 300, "attention_bias": True, "mlp_bias": True,
     "tie_word_embeddings": True},
    {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "head_dim": 32},
    {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300},
    {"model_type": "gpt2", "n_embd": 64, "n_layer": 3, "n_head": 4, "vocab_size": 300, "n_positions": 128,
     "n_inner": 100, "tie_word_embeddings": False},
])
def test_count_matches_what_transformers_builds(config):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **kwargs))
    assert shape_of(config).total == sum(p.numel() for p in model.parameters())


def test_unsupported_architecture_and_bad_sizes_name_the_field():
    with pytest.raises(RunValidationError, match='model.config.model_type="falcon"'):
        shape_of({"model_type": "falcon"})
    with pytest.raises(RunValidationError, match="model.config.hidden_size=-1 is invalid: expected a positive"):
        shape_of({**LLAMA2_7B, "hidden_size": -1})
    # absent, it was `model.config.vocab_size=null`, a value the config did not hold; null itself is still quoted
    with pytest.raises(RunValidationError, match="model.config.vocab_size is missing: expected a value"):
        shape_of({k: v for k, v in LLAMA2_7B.items() if k != "vocab_size"})
    with pytest.raises(RunValidationError, match="model.config.vocab_size=null is invalid: expected a value"):
        shape_of({**LLAMA2_7B, "vocab_size": None})


PEFT_SHAPES = {  # small configs of each supported family, with the features that change the count
    "llama": {"model_type": "llama", "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "mlp_bias": True},
    "mistral": {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "head_dim": 32},
    "qwen2-tied": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
                   "tie_word_embeddings": True},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 3, "n_head": 4, "vocab_size": 300, "n_positions": 128,
             "n_inner": 100},
}


@pytest.mark.parametrize("arch, rank, targets", [(arch, 8, "all-linear") for arch in sorted(PEFT_SHAPES)] + [
    (arch, 4, ("q_proj", "v_proj", "down_proj")) for arch in ("llama", "mistral", "qwen2-tied")] + [
    ("gpt2", 16, ("c_attn", "c_proj"))])  # GPT-2 has two c_proj per block (attention, MLP): both are adapted
def test_lora_count_equals_peft_trainable_parameters_on_the_built_model(arch, rank, targets):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = PEFT_SHAPES[arch]
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **kwargs))
        peft_model = get_peft_model(model, LoraConfig(r=rank, target_modules=targets if targets == "all-linear"
                                                      else list(targets)))
    trainable, _total = peft_model.get_nb_trainable_parameters()
    assert lora_parameters(shape_of(config), rank, targets) == trainable
