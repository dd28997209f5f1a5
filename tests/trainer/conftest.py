"""Shared, expensive fixtures for the trainer tests: tiny assets built once, one baseline training run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from spotrun.local.harness import free_port, loss_history, start_launcher, val_history, write_sagemaker_root
from spotrun_trainer.export import MERGED_DIR

BASE_HP = {
    "nproc_per_node": 2, "training.micro_batch": 2, "max_steps": 24, "log_every": 4, "num_threads": 1,
    "deterministic": True, "training.seed": 3, "training.lr": 3e-3, "optim.warmup_steps": 2, "data.seq_len": 64,
    "checkpoint.interval_steps": 4, "checkpoint.keep": 2,
    "eval.every_steps": 8,  # and before the first step and at the end: the data's validation/ split
    "export.dtype": "float32",  # bitwise comparisons of exported weights at training precision (default: bf16)
}
# A LoRA run on the same base and data: rank 8 on every linear layer, dropout on (its RNG must resume exactly),
# the merged model exported too.
LORA_HP = {"training.method": "lora", "training.lora.rank": 8, "training.lora.alpha": 16, "training.lora.dropout": 0.1,
           "training.lr": 1e-2, "export.merge_lora": True, "export.dtype": ""}
LORA_BASELINE_SOURCE = "s3://art-bucket/models/tiny/"  # the run's model.source, as the pipeline sends it
# What each method exports, compared tensor by tensor between an interrupted run and its uninterrupted reference.
EXPORTED = {"full": ("model.safetensors",),
            "lora": ("adapter_model.safetensors", f"{MERGED_DIR}/model.safetensors")}


def assert_same_run(job, reference, method: str = "full") -> None:
    assert loss_history(job.output) == loss_history(reference.output)  # exact floats, every step
    assert val_history(job.output) == val_history(reference.output)  # exact floats, every evaluation
    evaluated = val_history(reference.output)
    assert 0 in evaluated and max(loss_history(reference.output)) in evaluated  # the base model's, ..., the end
    for name in EXPORTED[method]:
        ours, ref = load_file(job.output / name), load_file(reference.output / name)
        assert ours.keys() == ref.keys()
        for key in ref:
            assert ours[key].equal(ref[key]), (name, key)


class Job:
    """One local 'training job': a SageMaker root, its checkpoint dir and its launcher runs."""

    def __init__(self, root: Path, assets: dict, model_key: str = "model", channels: dict | None = None, **hp):
        self.root = root
        self.ckpt = root / "checkpoints"
        self.log = root / "launcher.log"
        hyper = {**BASE_HP, "master_port": free_port(), **hp}
        hyper = {k: v for k, v in hyper.items() if v != ""}
        write_sagemaker_root(root / "sm", hyperparameters=hyper,
                             channels={"train": assets["data"], "model": assets[model_key], **(channels or {})},
                             checkpoint_dir=self.ckpt)

    @property
    def output(self) -> Path:
        return self.root / "sm" / "model"

    @property
    def failure(self) -> Path:
        return self.root / "sm" / "output" / "failure"

    def start(self):
        return start_launcher(self.root / "sm", self.log)

    def run(self, timeout: float = 600) -> int:
        proc = self.start()
        return proc.wait(timeout=timeout)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
def baseline(tmp_path_factory, assets) -> Job:
    """The uninterrupted reference run every resume test compares against."""
    job = Job(tmp_path_factory.mktemp("baseline"), assets, probe_logits_path=str(
        tmp_path_factory.getbasetemp() / "baseline-probe.pt"))
    rc = job.run()
    assert rc == 0, job.text()[-4000:]
    return job


@pytest.fixture(scope="session")
def lora_baseline(tmp_path_factory, assets) -> Job:
    """The uninterrupted LoRA run every LoRA resume and export test compares against."""
    job = Job(tmp_path_factory.mktemp("lora-baseline"), assets, probe_logits_path=str(
        tmp_path_factory.getbasetemp() / "lora-probe.pt"), **LORA_HP, **{"model.source": LORA_BASELINE_SOURCE})
    rc = job.run()
    assert rc == 0, job.text()[-4000:]
    return job


@pytest.fixture
def job_factory(tmp_path, assets):
    def make(name: str = "job", **hp) -> Job:
        root = tmp_path / name
        root.mkdir()
        return Job(root, assets, **hp)

    return make



@pytest.fixture(scope="session")
def unrelated_validation(assets, tmp_path_factory) -> Path:
    """Validation text unlike the training sentences: its loss falls first, then rises as the model fits them
    (the best validation step comes before the last)."""
    from spotrun_trainer.data import prepare

    root = tmp_path_factory.mktemp("unrelated")
    text = root / "other.jsonl"
    text.write_text("".join(json.dumps({"text": f"{i} {i * 7 % 13} {i * 3 % 11} zebra quantum {i % 5}"}) + "\n"
                            for i in range(200)))
    prepare([text], str(assets["tokenizer"]), root / "val")
    return root / "val"
