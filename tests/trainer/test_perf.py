"""The GPU speed paths, checked on CPU where they run: the chunked loss against HF's own loss (value and
gradients), the config's auto resolution and errors, and a 2-rank FSDP2 run with every path forced on."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F

from spotrun.local.harness import loss_history
from spotrun.settings.checks import ConfigError
from spotrun.settings.sections import PerfConfig
from spotrun_trainer.loss import CausalLMLoss, chunked_cross_entropy

TINY_LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 503, "max_position_embeddings": 128}


def _tiny(model_type: str = "llama", **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    spec = {**TINY_LLAMA, **extra} if model_type == "llama" else extra
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **spec), dtype=torch.float32)


@pytest.mark.parametrize("chunk_tokens", [1, 7, 64, 10_000])  # single rows, ragged chunks, exact, one chunk
def test_chunked_loss_equals_hf_loss_and_its_gradients(chunk_tokens):
    ref, ours = _tiny(), _tiny()
    ours.load_state_dict(ref.state_dict())
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (3, 43), generator=torch.Generator().manual_seed(1))

    ref_loss = ref(input_ids=ids, labels=ids).loss
    ref_loss.backward()
    loss = CausalLMLoss(ours, "chunked", chunk_tokens)(ours, ids)
    loss.backward()

    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    ref_grads = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name].grad, rtol=1e-5, atol=1e-7, msg=name)


def test_chunked_cross_entropy_ignores_masked_targets_like_torch():
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 9, 16, generator=gen, requires_grad=True)
    weight = torch.randn(40, 16, generator=gen, requires_grad=True)
    labels = torch.randint(0, 40, (2, 9), generator=gen)
    labels[0, 3:6] = -100
    ours = chunked_cross_entropy(hidden, weight, labels, chunk_tokens=4)
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
    ref = F.cross_entropy((hidden @ weight.T).reshape(-1, 40), shifted.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(ours, ref)
    gh, gw = torch.autograd.grad(ours, (hidden, weight))
    rh, rw = torch.autograd.grad(ref, (hidden, weight))
    torch.testing.assert_close(gh, rh)
    torch.testing.assert_close(gw, rw)


def test_chunked_loss_refuses_a_model_that_soft_caps_its_logits():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("gemma2", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=64,
                                  final_logit_softcapping=30.0)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="final_logit_softcapping=30.0.*perf.loss=hf"):
        CausalLMLoss(model, "chunked", 128)


def test_auto_turns_the_gpu_paths_on_for_cuda_and_off_for_cpu():
    cpu, cuda = PerfConfig().resolved("cpu"), PerfConfig().resolved("cuda")
    assert (cpu.fused_optimizer, cpu.loss) == ("off", "hf")
    assert (cuda.fused_optimizer, cuda.loss) == ("on", "chunked")
    assert cpu.compile == cuda.compile == "off"  # compile is opt-in: minutes at every (re)start
    assert PerfConfig(compile="auto").resolved("cuda").compile == "on"
    assert PerfConfig(loss="hf", fused_optimizer="off").resolved("cuda").loss == "hf"


@pytest.mark.parametrize("field, value, accepted", [
    ("loss", "liger", "one of auto, hf, chunked"),
    ("fused_optimizer", "yes", "one of auto, on, off"),
    ("reduce_dtype", "float16", "float32 or bfloat16"),
    ("prefetch_blocks", -1, "an integer >= 0"),
    ("loss_chunk_tokens", 0, "an integer >= 1"),
])
def test_bad_perf_values_name_the_field_and_what_is_accepted(field, value, accepted):
    written = re.escape(json.dumps(value))  # as the run file spells it
    with pytest.raises(ConfigError, match=rf"perf\.{field}={written} is invalid: expected {accepted}"):
        PerfConfig(**{field: value})


@pytest.mark.slow
def test_every_gpu_path_forced_on_trains_under_fsdp2_like_the_plain_run(job_factory, baseline):
    # Chunked loss (head weight read after the root's forward), fused AdamW, explicit prefetch, no reshard after
    # forward and bf16 gradient reduction, on 2 CPU ranks: the same optimisation up to rounding.
    job = job_factory("perf-on", **{"perf.loss": "chunked", "perf.loss_chunk_tokens": 50,
                                    "perf.fused_optimizer": "on", "perf.prefetch_blocks": 1,
                                    "perf.reshard_after_forward": "false", "perf.reduce_dtype": "bfloat16",
                                    "checkpoint.interval_steps": 0})
    assert job.run() == 0, job.text()[-4000:]
    ours, ref = loss_history(job.output), loss_history(baseline.output)
    assert sorted(ours) == list(range(1, 25))
    assert ours[1] == pytest.approx(ref[1], rel=1e-6)  # same weights, same batch: only the loss's summation order
    for step in range(2, 25):
        assert ours[step] == pytest.approx(ref[step], rel=2e-2), step  # bf16 reduction rounds the gradients
    assert json.loads((job.output / "metrics.json").read_text())["steps"] == 24
