"""samples.json beside the exported model: greedy generations from the first validation samples' prefixes, base
vs fine-tuned, equal to a plain argmax loop written here over the raw validation shard and the exported files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from spotrun.seams import SAMPLES_FILE
from spotrun.settings.sections import EvalConfig
from spotrun_trainer.data import read_index

pytestmark = pytest.mark.slow

SEQ_LEN = 64  # conftest.BASE_HP's data.seq_len


def _argmax_loop(model, prompt: list[int], new: int) -> list[int]:
    """Greedy decoding by hand: the whole sequence through the model each step, the highest logit appended, until
    `new` tokens or the model's end-of-sequence token (its generation config's, as a user's generate stops)."""
    eos = model.generation_config.eos_token_id
    eos = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            if ids[-1] in eos:
                break
    return ids[len(prompt):]


def _argmax_continuation(model_dir, prompt: list[int], new: int) -> list[int]:
    return _argmax_loop(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(), prompt, new)


def test_samples_are_greedy_generations_of_the_base_and_the_exported_model_from_the_first_validation_prefixes(
        baseline, assets):
    doc = json.loads((baseline.output / SAMPLES_FILE).read_text())
    defaults = EvalConfig()
    assert (len(doc["samples"]), doc["prompt_tokens"], doc["new_tokens"]) == (
        defaults.samples, defaults.sample_prompt_tokens, defaults.sample_new_tokens)
    val = assets["data"] / "validation"
    index = read_index(val)
    first = index["shards"][0]
    tokens = np.fromfile(val / first["file"], dtype=index["dtype"]).astype(np.int64)
    tok = AutoTokenizer.from_pretrained(baseline.output)
    for i, sample in enumerate(doc["samples"]):
        prompt = [int(t) for t in tokens[i * SEQ_LEN : i * SEQ_LEN + doc["prompt_tokens"]]]
        assert sample["prompt_ids"] == prompt
        assert sample["base_ids"] == _argmax_continuation(assets["model"], prompt, doc["new_tokens"])
        assert sample["tuned_ids"] == _argmax_continuation(baseline.output, prompt, doc["new_tokens"])
        assert sample["tuned"] == tok.decode(sample["tuned_ids"])
    # Training changed what the model says on at least one prompt (else the comparison shows nothing).
    assert any(s["base_ids"] != s["tuned_ids"] for s in doc["samples"])



def test_a_lora_run_generates_from_the_base_with_its_exported_adapter(lora_baseline, baseline, assets):
    """The adapter path: the base's generations are the full run's (same base model, same prompts); the
    fine-tuned ones equal an argmax loop over PEFT's own loading of the exported adapter onto the base."""
    from peft import PeftModel

    lora, full = (json.loads((job.output / SAMPLES_FILE).read_text()) for job in (lora_baseline, baseline))
    assert [s["base_ids"] for s in lora["samples"]] == [s["base_ids"] for s in full["samples"]]
    base = AutoModelForCausalLM.from_pretrained(assets["model"], dtype=torch.float32)
    tuned = PeftModel.from_pretrained(base, lora_baseline.output).eval()
    sample = lora["samples"][0]
    assert sample["tuned_ids"] == _argmax_loop(tuned, sample["prompt_ids"], lora["new_tokens"])


def test_a_generation_ends_at_the_models_end_of_sequence_token():
    """A chat model's answer ends at its end of turn, as a user's generate stops: the report showed a new user's
    fine-tuned answer running on past it (`min_new_tokens` suppressed the end-of-sequence token)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from spotrun_trainer.samples import generate

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()
    prompt = [1, 5, 7, 9]
    model.generation_config.eos_token_id = None
    free = _argmax_loop(model, prompt, 8)  # without an end-of-sequence token: 8 greedy tokens
    model.generation_config.eos_token_id = free[2]  # the third greedy token ends the sequence
    stop = free.index(free[2]) + 1
    assert generate(model, [prompt], 8) == [free[:stop]] == [_argmax_loop(model, prompt, 8)]
