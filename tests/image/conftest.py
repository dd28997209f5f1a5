"""One trainer image for every image test: the stand-in base (cached by its inputs), then `docker build` of the
trainer asset the session's one synth staged. Its size and build time are reported at the end of the session
(and written to image-report.json in pytest's base temp directory).

These tests need a Docker daemon and root (debootstrap). Where either is missing they skip with the reason, unless
SPOTRUN_REQUIRE_DOCKER=1 (set by .ci/run once it has started dockerd): then they fail, so CI cannot skip them.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from . import images

# The stand-in base already carries the CPU torch 2.13.0 wheel: the pin is satisfied in place, and the step that
# replaces torch (removing the base's torchvision/torchaudio) still runs.
STANDIN_TORCH_PIP = "torch==2.13.0"
REPORT: dict = {}


@pytest.fixture(scope="session")
def docker_ready() -> None:
    reason = images.unavailable()
    if reason is None:
        return
    if os.environ.get("SPOTRUN_REQUIRE_DOCKER") == "1":
        pytest.fail(f"SPOTRUN_REQUIRE_DOCKER=1 but the image tests cannot run: {reason}")
    pytest.skip(f"image tests need Docker and root: {reason}")


@pytest.fixture(scope="session")
def trainer_image(docker_ready, synth, tmp_path_factory):
    started = time.monotonic()
    base = images.standin_base()
    base_seconds = time.monotonic() - started
    tag = f"spotrun-trainer-test:{os.getpid()}"
    build = images.build_trainer(synth.outdir, base=base, torch_pip=STANDIN_TORCH_PIP, tag=tag)
    REPORT.update({"base_image": base, "base_seconds (0 when cached)": round(base_seconds, 1),
                   "trainer_build_seconds": round(build.seconds, 1), "trainer_image_bytes": build.size_bytes,
                   "base_image_bytes": int(images.docker("image", "inspect", "--format", "{{.Size}}", base)),
                   "asset_directory": build.directory.name, "build_args": build.build_args})
    (tmp_path_factory.getbasetemp() / "image-report.json").write_text(json.dumps(REPORT, indent=1))
    yield build
    images.docker("image", "rm", "--force", tag, check=False)


def pytest_terminal_summary(terminalreporter):
    if REPORT:
        terminalreporter.section("trainer image")
        for key, value in REPORT.items():
            if key != "scenario_seconds":
                terminalreporter.write_line(f"{key}: {value}")
        scenarios = REPORT.get("scenario_seconds", {})
        for name, seconds in scenarios.items():
            terminalreporter.write_line(f"scenario {name}: {seconds:.1f} s")
