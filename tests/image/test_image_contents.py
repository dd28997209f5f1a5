"""What the built trainer image holds: the trainer and spotrun's seams without the local pipeline, and no
torchvision left from the base (the stand-in base brings one built for another torch, as the real base does)."""

from __future__ import annotations

import subprocess

NMS = "operator torchvision::nms does not exist"


def _python(image: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "run", "--rm", "--entrypoint", "python", image, "-c", code],
                          capture_output=True, text=True, timeout=300)


def test_the_base_torchvision_that_breaks_transformers_is_removed_from_the_image(trainer_image):
    base = _python(trainer_image.build_args["BASE_IMAGE"], "import torchvision")
    assert base.returncode != 0 and NMS in base.stderr  # the stand-in reproduces the trap
    image = _python(trainer_image.tag, "import importlib.util as u; print(u.find_spec('torchvision'), "
                    "u.find_spec('torchaudio'))")
    assert image.returncode == 0 and image.stdout.split() == ["None", "None"], image.stderr


def test_the_image_installs_spotrun_without_its_local_pipeline(trainer_image):
    probe = _python(trainer_image.tag, "import spotrun.seams, spotrun_trainer.train, importlib.util as u; "
                    "print(u.find_spec('spotrun.local'))")
    assert probe.returncode == 0 and probe.stdout.strip() == "None", probe.stderr


def test_the_image_runs_the_preparation_job_as_sagemaker_processing_starts_it(trainer_image, assets, tmp_path):
    """The ContainerEntrypoint the estimate plans (spotrun.pipeline.preparation), in the built image, with SageMaker
    Processing's /opt/ml (config/resourceconfig.json, processing/input/{data,tokenizer}) and no network."""
    import json
    import shutil

    from spotrun.pipeline.preparation import processing_request
    from spotrun.seams import PreparationSettings

    root = tmp_path / "ml"
    (root / "config").mkdir(parents=True)
    (root / "config" / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-2",
                                                                     "hosts": ["algo-1", "algo-2"]}))
    (root / "processing" / "input" / "data").mkdir(parents=True)
    shutil.copy(assets["corpus"], root / "processing" / "input" / "data" / "part.jsonl")
    shutil.copytree(assets["tokenizer"], root / "processing" / "input" / "tokenizer")
    request = processing_request(key="k" * 24, raw_uri="s3://b/datasets/raw/", tokenizer_manifest_uri="s3://b/m",
                                 bucket="b", files=2, settings=PreparationSettings(), usd_per_hour=0.23,
                                 runtime_s=3600, name="spotrun-dev-prep-x", volume_kms_key_arn="", tags=[],
                                 text_field="text", validation_fraction=0.1, poll_seconds=60)
    entry = request.entrypoint
    run = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{root}:/opt/ml",
                          "--entrypoint", entry[0], trainer_image.tag, *entry[1:]],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    index = json.loads((root / "processing" / "output" / "parts" / "algo-2" / "index.json").read_text())
    assert index["total_tokens"] > 0 and index["validation"]["fraction"] == 0.1
