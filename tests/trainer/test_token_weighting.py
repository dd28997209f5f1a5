"""The step's loss is the mean over every trained token of the step (all micro-batches, all ranks), and so is its
gradient: checked against a reference computed by hand on one unsharded model over the concatenated tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spotrun.local.harness import free_port
from spotrun_trainer.data import TokenShardLoader, prepare

pytestmark = pytest.mark.slow
PROBE = Path(__file__).with_name("token_weight_probe.py")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
RANKS, GRAD_ACCUM, MICRO_BATCH, SEQ_LEN = 2, 3, 1, 48


def _uneven_chats(path: Path) -> None:
    """Long prompts with one-word answers beside short prompts with long answers: micro-batches of the same
    step hold very different numbers of trained tokens (some none at all)."""
    long_prompt = "the cat saves the weights and the node shards its data " * 2
    long_answer = "our model resumes every step and the checkpoint saves the weights. " * 3
    rows = []
    for i in range(30):
        if i % 2:
            rows.append([{"role": "user", "content": "why?"}, {"role": "assistant", "content": long_answer}])
        else:
            rows.append([{"role": "user", "content": long_prompt}, {"role": "assistant", "content": "yes."}])
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows))


@pytest.fixture(scope="module")
def chat_data(assets, tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("uneven")
    tok = AutoTokenizer.from_pretrained(assets["tokenizer"])
    tok.chat_template = CHATML
    tok.save_pretrained(root / "tokenizer")
    _uneven_chats(root / "chat.jsonl")
    prepare([root / "chat.jsonl"], str(root / "tokenizer"), root / "data", shard_bytes=1 << 20)
    return root / "data"


def _step_batches(data: Path) -> list[dict]:
    """Every micro-batch of the first step, of every rank, read by the loader as each rank reads it."""
    out = []
    for rank in range(RANKS):
        loader = TokenShardLoader(data, seq_len=SEQ_LEN, micro_batch=MICRO_BATCH, dp_rank=rank, dp_size=RANKS, seed=0)
        for _ in range(GRAD_ACCUM):
            loader_state = loader.state
            out.append(loader.next_inputs())
            # each rank's next micro-batch is RANKS * MICRO_BATCH samples on (the loader's own stride)
            assert loader.state.position == loader_state.position + RANKS * MICRO_BATCH
    return out


@pytest.mark.parametrize("loss", ["hf", "chunked"])
def test_step_loss_and_gradients_are_the_token_mean_over_all_micro_batches_and_ranks(assets, chat_data, tmp_path,
                                                                                     loss):
    from transformers import AutoModelForCausalLM

    cfg = {"perf": {"loss": loss, "loss_chunk_tokens": 16}, "model": {"path": str(assets["model"])},
           "data": {"path": str(chat_data), "seq_len": SEQ_LEN},
           "training.micro_batch": MICRO_BATCH, "training.grad_accum": GRAD_ACCUM, "output_dir": str(tmp_path / "out"),
           "num_threads": 1, "deterministic": True, "optim": {"grad_clip": 0.0}}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "out").mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(RANKS),
                          "--master_port", str(free_port()), str(PROBE), str(tmp_path / "cfg.json"),
                          str(tmp_path / "probe.pt")], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    got = torch.load(tmp_path / "probe.pt")

    # The reference by hand: one unsharded model, all the step's micro-batches of all ranks as one batch.
    batches = _step_batches(chat_data)
    ids = torch.cat([torch.from_numpy(b["input_ids"]) for b in batches])
    labels = torch.cat([torch.from_numpy(b["labels"]) for b in batches])
    model = AutoModelForCausalLM.from_pretrained(assets["model"], dtype=torch.float32)
    logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), dim=-1)
    target = labels[:, 1:]
    keep = target != -100
    picked = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    reference = -(picked * keep).sum() / keep.sum()
    reference.backward()

    counts = [int((torch.from_numpy(b["labels"])[:, 1:] != -100).sum()) for b in batches]
    assert min(counts) < max(counts) / 3, counts  # the data is uneven enough to tell the weightings apart
    with torch.no_grad():
        means = [(-(picked[i] * keep[i]).sum() / keep[i].sum().clamp(min=1)).item() for i in range(len(batches))]
    mean_of_means = sum(means) / len(means)
    assert abs(mean_of_means - reference.item()) > 0.05 * reference.item()  # what the old loss would have logged

    assert got["loss"] == pytest.approx(reference.item(), rel=1e-5)
    expected = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got["grads"].keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
