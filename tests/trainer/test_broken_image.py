"""A broken image (a torchvision built for another torch, as a replaced base torch leaves behind) fails with the
underlying import error in SageMaker's failure file, not as an invalid configuration. The trainer image itself
removes that torchvision (training_image/Dockerfile; built and run in tests/image)."""

from __future__ import annotations

import os

from spotrun.local.harness import start_launcher, write_sagemaker_root

NMS = "operator torchvision::nms does not exist"


def fake_mismatched_torchvision(root):
    """A `torchvision` that transformers finds installed (package + metadata) and that fails at import the way a
    build for another torch does (its operator registration raises)."""
    package = root / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise RuntimeError({NMS!r})\n")
    meta = root / "torchvision-0.25.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.25.0\n")
    return root


def test_an_import_error_in_the_image_reaches_the_failure_file_with_its_cause(assets, tmp_path, monkeypatch):
    fake = fake_mismatched_torchvision(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    root = write_sagemaker_root(tmp_path / "sm", channels={"train": assets["data"], "model": assets["model"]},
                                checkpoint_dir=None, hyperparameters={"nproc_per_node": 1})
    proc = start_launcher(root, tmp_path / "launcher.log")
    assert proc.wait(timeout=300) == 1
    failure = (root / "output" / "failure").read_text()
    assert failure.startswith(f"broken image: the trainer's imports fail: RuntimeError: {NMS}"), failure
    assert "invalid configuration" not in failure and failure.count("\n") == 1
    assert "launch:" not in (tmp_path / "launcher.log").read_text()  # no worker start-up was paid for
