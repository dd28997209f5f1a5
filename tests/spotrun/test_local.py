"""`spotrun local`: the run JSON through estimate, prepare, the launcher with a spot interruption and restart,
the local registry and the report; checked against an uninterrupted run of the same JSON (two real 2-process
runs, shared by the tests below)."""

from __future__ import annotations

import json
import struct

import pytest

from spotrun.cli import main
from spotrun.contract import RunValidationError
from spotrun.handlers.cost_guard import REGISTRY_METADATA_KEYS
from spotrun.local.demo import weights_identical
from spotrun.local.harness import loss_records
from spotrun.local.pipeline import InterruptAt, LocalOptions, load_run, run_local
from spotrun.local.registry import describe, register, versions

STEPS = 12
SETTINGS = [f"max_steps={STEPS}", "checkpoint.interval_steps=4", "micro_batch=2", "log_every=2"]


@pytest.fixture(scope="session")
def runs(tmp_path_factory, assets) -> dict:
    """One run JSON on raw text (the pipeline prepares it), run interrupted (CLI) and uninterrupted (API)."""
    root = tmp_path_factory.mktemp("local")
    run = {"version": 1, "name": "local-test", "model": {"source": str(assets["model"])},
           "data": {"source": str(assets["corpus"].parent), "seq_len": 64},
           "training": {"lr": 0.003, "seed": 3}, "compute": {"instance_type": "ml.g5.xlarge"},
           "budget": {"max_usd": 5}, "registry": {"model_package_group": "local-tests"}}
    path = root / "run.json"
    path.write_text(json.dumps(run))
    argv = ["local", str(path), "--out", str(root / "out"), "--job-name", "interrupted", "--interrupt-at", "5",
            "--progress", "lines", "--format", "json"]
    for setting in SETTINGS:
        argv += ["--set", setting]
    code = main(argv)
    assert code == 0
    interrupted = json.loads((root / "out" / "interrupted" / "report.json").read_text())
    reference = run_local(path, LocalOptions(out=root / "out", job_name="reference", progress="none",
                                             overrides=dict(s.split("=") for s in SETTINGS)), emit=lambda _: None)
    return {"root": root, "interrupted": interrupted, "reference": reference}


@pytest.mark.slow
def test_an_interrupted_local_run_resumes_and_registers_the_same_weights_as_an_uninterrupted_one(runs):
    rep, ref = runs["interrupted"], runs["reference"]
    assert rep["interruptions"] == 1 and ref["interruptions"] == 0
    event = rep["interruption_log"][0]
    assert event["kind"] == "sigterm" and event["checkpoint_step"] == event["step"] >= 5  # saved on the notice
    assert rep["actual"]["steps"] == STEPS and rep["actual"]["steps_redone"] == 0 and rep["actual"]["starts"] == 2
    assert rep["actual"]["lost_seconds"] > 0 and event["lost_s"] == rep["actual"]["lost_seconds"]
    assert weights_identical(rep["model_data_url"], ref["model_data_url"])
    job = runs["root"] / "out" / "interrupted"
    assert loss_records(job / "sm" / "model") == loss_records(runs["root"] / "out" / "reference" / "sm" / "model")
    log = (job / "launcher.log").read_text()
    assert "run_stopped" in log and "Traceback" not in log  # a clean save-and-stop leaves no traceback


@pytest.mark.slow
def test_metrics_and_loss_history_cover_the_whole_run_in_readable_and_exact_form(runs):
    output = runs["root"] / "out" / "interrupted" / "sm" / "model"
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["steps"] == STEPS and metrics["starts"] == 2
    segments = metrics["segments"]
    assert segments[0]["start_step"] == 0 and segments[-1]["end_step"] == STEPS
    assert all(a["end_step"] == b["start_step"] for a, b in zip(segments, segments[1:], strict=False))
    assert metrics["wall_s"] == pytest.approx(sum(s["seconds"] for s in segments))
    # The export is readable by the group like any other file (safetensors alone writes 0600).
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in output.iterdir() if p.suffix == ".safetensors"} == {
        "model.safetensors": "0o644"}
    for line in (output / "loss_history.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert isinstance(record["loss"], float) and float.fromhex(record["loss_hex"]) == record["loss"]


@pytest.mark.slow
def test_the_registry_holds_versioned_packages_with_the_aws_metadata(runs):
    rep, ref = runs["interrupted"], runs["reference"]
    first, second = describe(rep["model_package"]), describe(ref["model_package"])
    assert (first["ModelPackageVersion"], second["ModelPackageVersion"]) == (1, 2)
    assert first["ModelPackageGroupName"] == "local-tests" and first["ModelApprovalStatus"] == "PendingManualApproval"
    assert set(first["CustomerMetadataProperties"]) == set(REGISTRY_METADATA_KEYS)
    assert first["CustomerMetadataProperties"]["interruptions"] == "1"
    assert all(isinstance(v, str) for v in first["CustomerMetadataProperties"].values())
    registered = runs["root"] / "out" / "registry" / "local-tests" / "1" / "model"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in registered.iterdir()}


@pytest.mark.slow
def test_the_report_compares_estimate_and_outcome_and_plots_the_interruption(runs):
    rep = runs["interrupted"]
    assert rep["estimate"]["tokens"] > 0 and rep["instance_type"] == "ml.g5.xlarge"
    assert rep["cost_usd_at_rates"]["spot"] < rep["cost_usd_at_rates"]["on_demand"]
    assert rep["billable_seconds"] < rep["training_seconds"] and 0 < rep["spot_savings_pct"] < 100
    png = runs["root"] / "out" / "interrupted" / "loss.png"
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert (width, height) == (800, 450)
    summary = (runs["root"] / "out" / "interrupted" / "report.txt").read_text()
    assert "sigterm at step" in summary and "0 redone" in summary and "spot savings" in summary
    assert oct(png.stat().st_mode & 0o777) == "0o644"


def test_interrupt_points_are_steps_or_seconds_and_errors_name_the_value():
    assert InterruptAt.parse("12") == InterruptAt(step=12)
    assert InterruptAt.parse("2.5s") == InterruptAt(seconds=2.5)
    assert InterruptAt.parse("12").due(12, 0.0) and not InterruptAt.parse("30s").due(99, 29.0)
    for bad in ("0", "-3", "ten", "5m"):
        with pytest.raises(ValueError, match=f"--interrupt-at='{bad}' is invalid"):
            InterruptAt.parse(bad)


def test_local_runs_need_local_sources_and_say_which_field(tmp_path):
    run = {"version": 1, "name": "x", "model": {"source": "s3://bucket-a/models/m/"},
           "data": {"source": "data", "seq_len": 8}, "budget": {"max_usd": 1}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    with pytest.raises(RunValidationError) as err:
        load_run(path)
    assert err.value.field == "model.source" and "spotrun start" in str(err.value)
    run["model"] = {"source": "missing-model"}
    path.write_text(json.dumps(run))
    with pytest.raises(RunValidationError) as err:
        load_run(path)
    assert err.value.field == "model.source" and str(tmp_path / "missing-model") in str(err.value)
    run["data"] = {"tokens": 1000, "seq_len": 8}
    path.write_text(json.dumps(run))
    with pytest.raises(RunValidationError) as err:
        load_run(path)
    assert err.value.field == "data.source"


def test_registry_versions_count_up_per_group(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    report = {k: 1 for k in REGISTRY_METADATA_KEYS}
    entries = [register(tmp_path / "reg", "g", model_dir=model, description="d", approval_status="Approved",
                        report=report) for _ in range(3)]
    assert [e.name for e in entries] == ["1", "2", "3"] and versions(tmp_path / "reg" / "g") == [1, 2, 3]
    assert (entries[2] / "model" / "model.safetensors").read_bytes() == b"weights"


def test_the_trainer_image_ships_only_what_runs_in_sagemaker():
    from spotrun.local import TRAINER_ROOT

    package = TRAINER_ROOT / "spotrun_trainer"
    shipped = {p.name for p in package.glob("*.py")}
    assert not shipped & {"demo.py", "examples.py", "localrun.py"}
    for path in package.glob("*.py"):
        text = path.read_text()
        assert "spotrun.local" not in text and "def kill_tree" not in text, path.name
    assert "COPY training_image/spotrun_trainer ./spotrun_trainer" in (TRAINER_ROOT / "Dockerfile").read_text()
    # The image's build context is the repository root (it installs spotrun for the seams): the local pipeline
    # is excluded from it, in the CDK asset and for a hand-made `docker build`, so spotrun's package list must be
    # found in what is there, never listed (a listed package that is absent stops `pip install`). The image
    # tests (tests/image) build the staged asset and check spotrun.local is not in it.
    import tomllib

    from training_constructs.trainer_image import CONTEXT

    assert "spotrun/local" in CONTEXT
    assert "spotrun/local" in (TRAINER_ROOT.parent / ".dockerignore").read_text().splitlines()
    setuptools = tomllib.loads((TRAINER_ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["packages"] == {"find": {"include": ["spotrun", "spotrun.*"]}}  # found, not a list


def test_progress_lines_show_step_total_loss_throughput_eta_and_interruptions(tmp_path):
    from spotrun.local.progress import Progress
    from spotrun_trainer.metrics import format_line

    log = tmp_path / "launcher.log"
    lines: list[str] = []
    progress = Progress(log, mode="lines", emit=lines.append)
    log.write_text("run_start params=1 world=2 blocks=2 start_step=0 total_steps=40 device=cpu\n"
                   + format_line(5, loss=3.5, lr=1e-3, grad_norm=1.0, tokens_per_s=800, mfu=None, mem_gb=0.1) + "\n")
    progress.update(5, interruptions=0)
    with log.open("a") as fh:
        fh.write(format_line(10, loss=2.75, lr=1e-3, grad_norm=1.0, tokens_per_s=950, mfu=None, mem_gb=0.1) + "\n")
        fh.write("step=15 loss=2.5")  # a line still being written: not read yet
    progress.update(10, interruptions=1)
    assert lines[0].startswith("[local] step 5/40  loss 3.5000  tokens/s 800  ETA -  interruptions 0")
    assert lines[1].startswith("[local] step 10/40  loss 2.7500  tokens/s 950  ETA ")
    assert lines[1].endswith("interruptions 1") and "ETA -" not in lines[1]
