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
