"""`spotrun local`: the run JSON through estimate, prepare, the launcher with spot interruptions and restarts,
the local registry and the report; checked against an uninterrupted run of the same JSON, and a run stopped by
Ctrl-C and resumed with `--resume` (real 2-process runs, shared by the tests below)."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotrun.cli.main import main
from spotrun.contract.spec import RunValidationError
from spotrun.local.demo import weights_identical
from spotrun.local.harness import loss_records
from spotrun.local.pipeline import InterruptAt, LocalOptions, load_run, run_local
from spotrun.local.registry import describe, register, versions
from spotrun.pipeline.guard import REGISTRY_METADATA_KEYS

STEPS = 12
SETTINGS = [f"max_steps={STEPS}", "checkpoint.interval_steps=4", "training.micro_batch=2", "log_every=2"]


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
    # Out of order on purpose (they are sorted), and one after the run ends (reported as not injected: 3000 s is
    # within the plan's MaxRuntime of 3600 s, and the run takes about a minute; a step or a time past the plan is
    # refused up front).
    argv = ["local", str(path), "--out", str(root / "out"), "--job-name", "interrupted", "--interrupt-at", "8",
            "--interrupt-at", "3000s", "--interrupt-at", "4", "--progress", "lines", "--format", "json"]
    for setting in SETTINGS:
        argv += ["--set", setting]
    code = main(argv)
    assert code == 0
    interrupted = json.loads((root / "out" / "interrupted" / "report.json").read_text())
    reference = run_local(path, LocalOptions(out=root / "out", job_name="reference", progress="none",
                                             overrides=dict(s.split("=") for s in SETTINGS)), emit=lambda _: None)
    return {"root": root, "interrupted": interrupted, "reference": reference, "run": path}


@pytest.mark.slow
def test_an_interrupted_local_run_resumes_and_registers_the_same_weights_as_an_uninterrupted_one(runs):
    rep, ref = runs["interrupted"], runs["reference"]
    assert rep["interruptions"] == 2 and ref["interruptions"] == 0
    first, second = rep["interruption_log"]
    assert (first["trigger"], second["trigger"]) == ("step 4", "step 8")  # sorted
    for event, asked in ((first, 4), (second, 8)):
        assert event["kind"] == "sigterm" and event["checkpoint_step"] == event["step"] >= asked  # saved on notice
        # Sent when training reached the step asked for (the poll is 50 ms; importing torch first cost 8-9 steps).
        assert asked <= event["signalled_at_step"] <= asked + 2 and event["late"] == event["signalled_at_step"] - asked
        assert event["lost_s"] > 0
    assert second["at_s"] > first["at_s"] + first["lost_s"] - 1e-3
    assert rep["actual"]["steps"] == STEPS and rep["actual"]["steps_redone"] == 0 and rep["actual"]["starts"] == 3
    assert rep["actual"]["lost_seconds"] == pytest.approx(first["lost_s"] + second["lost_s"], abs=2e-3)
    assert 0 < rep["actual"]["restart_seconds"] < rep["actual"]["wall_seconds"]
    assert rep["interruptions_not_injected"] == [{"trigger": "3000s", "reason": "the run finished first"}]
    assert weights_identical(rep["model_data_url"], ref["model_data_url"])
    job = runs["root"] / "out" / "interrupted"
    assert loss_records(job / "sm" / "model") == loss_records(runs["root"] / "out" / "reference" / "sm" / "model")
    log = (job / "launcher.log").read_text()
    assert "run_stopped" in log and "Traceback" not in log  # a clean save-and-stop leaves no traceback


@pytest.mark.slow
def test_metrics_and_loss_history_cover_the_whole_run_in_readable_and_exact_form(runs):
    output = runs["root"] / "out" / "interrupted" / "sm" / "model"
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["steps"] == STEPS and metrics["starts"] == 3
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
    assert first["CustomerMetadataProperties"]["interruptions"] == "2"
    assert all(isinstance(v, str) for v in first["CustomerMetadataProperties"].values())
    registered = runs["root"] / "out" / "registry" / "local-tests" / "1" / "model"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in registered.iterdir()}


@pytest.mark.slow
def test_the_report_compares_estimate_and_outcome_and_plots_the_interruption(runs):
    rep = runs["interrupted"]
    assert rep["estimate"]["tokens"] > 0 and rep["instance_type"] == "ml.g5.xlarge"
    # Priced, not measured: this machine's launcher time at the planned instance's catalog rates, labelled.
    priced = rep["priced"]
    assert priced["basis"].startswith("priced, not measured") and rep["price_basis"] == priced["basis"]
    assert priced["training_seconds"] == pytest.approx(sum(
        s["ended_s"] - s["started_s"] for s in json.loads(
            (runs["root"] / "out" / "interrupted" / "timeline.json").read_text())["starts"]), abs=2e-3)
    assert priced["cost_usd_at_rates"]["spot"] < priced["cost_usd_at_rates"]["on_demand"]
    assert priced["billable_seconds"] < priced["training_seconds"] and 0 < priced["spot_savings_pct"] < 100
    assert rep["actual"]["basis"] == "measured on this machine"
    png = runs["root"] / "out" / "interrupted" / "loss.png"
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert (width, height) == (800, 450)
    summary = (runs["root"] / "out" / "interrupted" / "report.txt").read_text()
    measured, priced_text = summary.split("  priced, not measured: ")
    assert "  measured here:" in measured and "0 redone" in measured and "spot savings" not in measured
    assert "1. sigterm asked at step 4: sent at step 4" in measured and "$" not in measured
    assert "spot savings" in priced_text and "ml.g5.xlarge's catalog rates" in priced_text
    assert "not injected: 3000s (the run finished first)" in measured and "nan" not in summary
    assert oct(png.stat().st_mode & 0o777) == "0o644"


def test_interrupt_points_are_steps_or_seconds_and_errors_name_the_value():
    assert InterruptAt.parse("12") == InterruptAt(step=12)
    assert InterruptAt.parse("2.5s") == InterruptAt(seconds=2.5)
    assert InterruptAt.parse("12").due(12, 0.0) and not InterruptAt.parse("30s").due(99, 29.0)
    for bad in ("0", "-3", "ten", "5m"):
        with pytest.raises(ValueError, match=f"--interrupt-at={bad} is invalid"):
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
    trainer_root = Path(__file__).resolve().parents[2] / "training_image"
    package = trainer_root / "spotrun_trainer"
    shipped = {p.name for p in package.glob("*.py")}
    assert not shipped & {"demo.py", "examples.py", "localrun.py"}
    for path in package.glob("*.py"):
        text = path.read_text()
        assert "spotrun.local" not in text and "def kill_tree" not in text, path.name
    assert "COPY training_image/spotrun_trainer ./spotrun_trainer" in (trainer_root / "Dockerfile").read_text()
    # The image's build context is the repository root (it installs spotrun for the seams): the local pipeline
    # is excluded from it, in the CDK asset and for a hand-made `docker build`, so spotrun's package list must be
    # found in what is there, never listed (a listed package that is absent stops `pip install`). The image
    # tests (tests/image) build the staged asset and check spotrun.local is not in it.
    import tomllib

    from training_constructs.trainer_image import CONTEXT

    assert "spotrun/local" in CONTEXT
    assert "spotrun/local" in (trainer_root.parent / ".dockerignore").read_text().splitlines()
    setuptools = tomllib.loads((trainer_root.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["packages"] == {"find": {"include": ["spotrun", "spotrun.*"]}}  # found, not a list


def test_progress_lines_show_step_total_loss_throughput_eta_and_interruptions(tmp_path):
    from spotrun.local.progress import Progress
    from spotrun.seams import format_metric_line as format_line

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


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_with_a_checkpoint_and_resume_finishes_the_same_model(runs, assets):
    out = runs["root"] / "out"
    # The data prepared by `spotrun prepare` (the user's first step) rather than by the pipeline: the same model.
    prepared = runs["root"] / "prepared-by-cli"
    assert main(["prepare", str(assets["corpus"].parent), "--tokenizer", str(assets["model"]), "--out",
                 str(prepared)]) == 0
    run = json.loads(runs["run"].read_text())
    run["data"]["source"] = str(prepared)
    run_file = runs["root"] / "run-prepared.json"
    run_file.write_text(json.dumps(run))
    argv = [sys.executable, "-m", "spotrun", "local", str(run_file), "--out", str(out), "--job-name", "stopped",
            "--progress", "none"]
    for setting in SETTINGS:
        argv += ["--set", setting]
    history = out / "stopped" / "sm" / "model" / "loss_history.jsonl"
    cli = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ), text=True)
    deadline = time.monotonic() + 300
    while not (history.is_file() and len(history.read_text().splitlines()) >= 3):
        assert cli.poll() is None and time.monotonic() < deadline, cli.communicate()
        time.sleep(0.05)
    cli.send_signal(signal.SIGINT)  # what Ctrl-C sends the foreground process
    stdout, stderr = cli.communicate(timeout=300)
    assert cli.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert stderr.splitlines()[-1].startswith("stopped by Ctrl-C at step ")
    assert stderr.splitlines()[-1].endswith(f"Resume with: spotrun local --resume {out / 'stopped'}")
    timeline = json.loads((out / "stopped" / "timeline.json").read_text())
    stop = timeline["user_stops"][0]
    assert stop["checkpoint_step"] == stop["step"] >= 3  # the trainer saved where it stopped
    assert not (out / "stopped" / "report.json").exists()

    assert main(["local", "--resume", "stopped", "--out", str(out), "--progress", "none", "--format", "json"]) == 0
    rep = json.loads((out / "stopped" / "report.json").read_text())
    assert rep["actual"]["steps"] == STEPS and rep["actual"]["steps_redone"] == 0
    assert rep["actual"]["user_stops"] == 1 and rep["interruptions"] == 0 and rep["actual"]["starts"] == 2
    assert weights_identical(rep["model_data_url"], runs["reference"]["model_data_url"])
    assert "stopped by Ctrl-C 1 time(s), resumed with --resume" in (out / "stopped" / "report.txt").read_text()
    assert main(["local", "--resume", "stopped", "--out", str(out)]) == 2  # finished: nothing to resume


@pytest.mark.slow
def test_a_hard_kill_redoes_the_steps_after_the_last_checkpoint_and_registers_the_same_weights(runs):
    """`--hard-kill`: SIGKILL of the whole process tree, no notice, so nothing is saved at the kill; the restart
    resumes from the last committed interval checkpoint and redoes the steps after it, with the same losses."""
    out = runs["root"] / "out"
    argv = ["local", str(runs["run"]), "--out", str(out), "--job-name", "killed", "--hard-kill", "--interrupt-at",
            "6", "--progress", "none", "--format", "json"]
    for setting in SETTINGS:
        argv += ["--set", setting]
    assert main(argv) == 0
    rep = json.loads((out / "killed" / "report.json").read_text())
    (event,) = rep["interruption_log"]
    assert event["kind"] == "hard-kill" and event["signalled_at_step"] >= 6
    # checkpoint.interval_steps=4: the restart began at the last multiple of 4 that was committed before the kill.
    assert event["checkpoint_step"] % 4 == 0 and event["checkpoint_step"] <= event["step"]
    records = loss_records(out / "killed" / "sm" / "model")
    redone = [step for step, _ in records if [s for s, _ in records].count(step) > 1]
    assert rep["actual"]["steps_redone"] == len(redone) // 2 == event["step"] - event["checkpoint_step"]
    by_step: dict[int, set[float]] = {}
    for step, loss in records:
        by_step.setdefault(step, set()).add(loss)
    assert all(len(losses) == 1 for losses in by_step.values())  # a redone step has bitwise its first loss
    assert sorted(by_step) == [s for s, _ in loss_records(out / "reference" / "sm" / "model")]
    assert rep["actual"]["steps"] == STEPS and rep["interruptions"] == 1 and event["lost_s"] > 0
    assert weights_identical(rep["model_data_url"], runs["reference"]["model_data_url"])


def test_a_job_name_taken_is_invalid_input_and_a_completed_job_is_not_offered_for_resume(tmp_path, assets, capsys):
    """`--job-name` of an existing job directory was exit 1 (a failure) and advised `--resume` even for a job that
    had completed, which `--resume` then refuses."""
    run = {"version": 1, "name": "taken", "model": {"source": str(assets["model"])},
           "data": {"source": str(assets["corpus"].parent), "seq_len": 64},
           "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 5}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    out = tmp_path / "out"
    (out / "done").mkdir(parents=True)
    (out / "done" / "report.json").write_text("{}")
    (out / "stopped").mkdir()
    assert main(["local", str(path), "--out", str(out), "--job-name", "done"]) == 2
    err = capsys.readouterr().err
    assert err.startswith('error: InvalidRun: --job-name="done" is invalid: expected a name no job directory')
    assert "completed" in err and "--resume" not in err
    assert main(["local", str(path), "--out", str(out), "--job-name", "stopped"]) == 2
    err = capsys.readouterr().err
    assert f"did not finish: continue it with `spotrun local --resume stopped --out {out}`" in err
    assert not (out / "prepared").exists()  # refused before the raw text was tokenized


@pytest.mark.slow
@pytest.mark.parametrize("sent", ["SIGTERM", "SIGHUP"])  # SIGHUP: the terminal it ran in was closed
def test_sigterm_to_spotrun_local_stops_the_job_cleanly_instead_of_orphaning_it(tmp_path, assets, sent):
    """`kill PID` (or `timeout`, a CI runner's cancel) of `spotrun local` killed the CLI at once and left the
    launcher, torchrun and both workers training on in the background, reparented to init; now SIGTERM stops the
    job as Ctrl-C does: a checkpoint where it stopped, exit 130, the resume hint, no process of the job left."""
    from spotrun.local.harness import launchers_running

    run = {"version": 1, "name": "term", "model": {"source": str(assets["model"])},
           "data": {"source": str(assets["data"]), "seq_len": 64}, "training": {"lr": 0.003, "seed": 3},
           "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 5}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    out, job = tmp_path / "out", tmp_path / "out" / "term"
    argv = [sys.executable, "-m", "spotrun", "local", str(path), "--out", str(out), "--job-name", "term",
            "--progress", "none", "--set", "max_steps=200", "--set", "checkpoint.interval_steps=50",
            "--set", "training.micro_batch=2", "--set", "log_every=1"]
    history = job / "sm" / "model" / "loss_history.jsonl"
    cli = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # its own group: only the CLI gets the signal, as `kill PID`
    deadline = time.monotonic() + 300
    while not (history.is_file() and len(history.read_text().splitlines()) >= 3):
        assert cli.poll() is None and time.monotonic() < deadline, cli.communicate()
        time.sleep(0.05)
    cli.send_signal(getattr(signal, sent))
    stdout, stderr = cli.communicate(timeout=300)
    assert cli.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.splitlines()[-1].startswith(f"stopped by {sent} at step "), stderr
    assert stderr.splitlines()[-1].endswith(f"Resume with: spotrun local --resume {job}")
    assert launchers_running(job / "sm") == []
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, str(job))]
    assert left == [], left  # no torchrun or worker of the job either
    stop = json.loads((job / "timeline.json").read_text())["user_stops"][0]
    assert stop["by"] == sent and stop["checkpoint_step"] == stop["step"] >= 3  # saved where it stopped
    assert not (job / "report.json").exists()


def _cmdline_has(proc: Path, text: str) -> bool:
    try:
        return text.encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False
