"""Model helpers that need no process group: block discovery, the unsharded-block diagnostic, dtypes."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

from spotrun.local.examples import ARCHITECTURES
from spotrun.settings.checks import ConfigError
from spotrun.settings.sections import ModelConfig
from spotrun.settings.wire import from_dict, to_json
from spotrun_trainer.model import find_blocks, resolve_param_dtype, warn_unsharded_blocks


def _meta_model(arch: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(ARCHITECTURES[arch])
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.pop("model_type"), vocab_size=64, **spec))


@pytest.mark.parametrize("arch, block", [("llama", "LlamaDecoderLayer"), ("gpt2", "GPT2Block"),
                                         ("qwen2", "Qwen2DecoderLayer")])
def test_blocks_are_found_from_the_model_itself(arch, block):
    blocks = find_blocks(_meta_model(arch))
    assert [type(b).__name__ for b in blocks] == [block, block]


def test_without_no_split_modules_the_longest_homogeneous_module_list_is_used():
    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    toy = Toy()
    assert find_blocks(toy) == list(toy.layers)


def test_unsharded_blocks_are_reported(caplog):
    model = _meta_model("llama")
    with caplog.at_level(logging.WARNING):
        assert warn_unsharded_blocks(model, find_blocks(model)) == 2
    assert "2 of 2 decoder blocks are not their own FSDP unit" in caplog.text
    assert "root module is not an FSDP unit" in caplog.text


def test_param_dtype_defaults_to_bf16_on_gpu_and_fp32_on_cpu():
    assert resolve_param_dtype("auto", "cuda") is torch.bfloat16
    assert resolve_param_dtype("auto", "cpu") is torch.float32
    assert resolve_param_dtype("float32", "cuda") is torch.float32


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="model.param_dtype=\"fp8\" is invalid"):
        ModelConfig(path="/m", param_dtype="fp8")
    with pytest.raises(ConfigError, match="model.path/model.config"):  # what a job needs, checked at its entry
        from_dict({"data": {"path": "/d"}, "output_dir": "/o"})
    with pytest.raises(ConfigError, match='output_dir="" is invalid'):
        from_dict({"model": {"path": "/m"}, "data": {"path": "/d"}})
    cfg = from_dict({"model": {"path": "/m"}, "data": {"path": "/d"}, "output_dir": "/o"})
    assert from_dict(json.loads(to_json(cfg))) == cfg
