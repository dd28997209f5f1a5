"""`spotrun local` refuses bad input with one line and exit 2 before any worker starts (no job directory is made);
the prepared-data cache follows every tokenizer file; the interruption path imports nothing; every interruption
has its lost time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotrun.cli.main import main
from spotrun.local.pipeline import prepare_if_raw
from spotrun.local.supervisor import InterruptAt, Job, Supervisor, finish_lost_time


def _run_file(tmp_path, assets, **data) -> str:
    run = {"version": 1, "name": "inputs", "model": {"source": str(assets["model"])},
           "data": {"source": str(assets["corpus"].parent), "seq_len": 64, **data},
           "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 5}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    return str(path)


def _refused(capsys, tmp_path, argv: list[str]) -> str:
    code = main(["local", *argv, "--out", str(tmp_path / "out"), "--job-name", "j", "--progress", "none"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out" / "j").exists()  # refused here: no job directory, no launcher
    return err


def test_seq_len_beyond_the_models_positions_is_refused_naming_both(capsys, tmp_path, assets):
    err = _refused(capsys, tmp_path, [_run_file(tmp_path, assets, seq_len=512)])
    assert err.startswith("error: InvalidRun: data.seq_len=512") and "max_position_embeddings=256" in err
    assert not (tmp_path / "out" / "prepared").exists()  # refused before any tokenizing


def test_an_empty_model_directory_is_named_as_model_source(capsys, tmp_path, assets):
    path = _run_file(tmp_path, assets)
    run = json.loads(open(path).read())
    (tmp_path / "empty").mkdir()
    run["model"]["source"] = str(tmp_path / "empty")
    open(path, "w").write(json.dumps(run))
    err = _refused(capsys, tmp_path, [path])
    assert "model.source=" in err and "config.json" in err and "it is empty" in err and "data.source" not in err


def test_data_that_is_not_utf8_is_named_by_file_and_line(capsys, tmp_path, assets):
    data = tmp_path / "text"
    data.mkdir()
    (data / "a.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    err = _refused(capsys, tmp_path, [_run_file(tmp_path, assets, source=str(data))])
    assert "data.source=" in err and "a.jsonl:2: not UTF-8 text (byte 0xe9" in err


def test_a_dataset_smaller_than_one_step_is_refused(capsys, tmp_path, assets):
    data = tmp_path / "text"
    data.mkdir()
    (data / "a.jsonl").write_text(json.dumps({"text": "the cat saves the weights."}) + "\n")
    err = _refused(capsys, tmp_path, [_run_file(tmp_path, assets, source=str(data))])
    # the planner's refusal (spotrun/planner/estimate.py), before the local one that counts packed samples per process
    assert "data.source=" in err and "expected at least 64 tokens (its index.json counts " in err, err
    assert "one optimizer step of this plan is 1 sample of data.seq_len=64" in err


def test_a_configuration_error_the_launcher_would_find_exits_2_before_the_job_directory(capsys, tmp_path, assets):
    err = _refused(capsys, tmp_path, [_run_file(tmp_path, assets), "--set", "training.seed=-1"])
    assert err.startswith("error: InvalidConfiguration: invalid configuration: ")
    assert "training.seed=-1 is invalid" in err


def test_resume_needs_a_job_and_not_a_run_file_too(capsys, tmp_path, assets):
    assert main(["local", "--resume", "nothing-here", "--out", str(tmp_path)]) == 2
    assert '--resume="nothing-here"' in capsys.readouterr().err
    assert main(["local", _run_file(tmp_path, assets), "--resume", "x"]) == 2


def test_the_prepared_cache_follows_every_tokenizer_file_including_the_chat_template(tmp_path, assets):
    model = tmp_path / "model"
    shutil.copytree(assets["model"], model)
    raw = {"model": {"source": str(model)}, "data": {"source": str(assets["corpus"].parent)}}
    first, done = prepare_if_raw(raw, tmp_path / "cache", emit=lambda _: None)
    assert done == "prepared"
    assert prepare_if_raw(raw, tmp_path / "cache", emit=lambda _: None) == (first, "reused")
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    second, done = prepare_if_raw(raw, tmp_path / "cache", emit=lambda _: None)
    assert done == "prepared" and second["data"]["source"] != first["data"]["source"]
    (model / "model.safetensors").write_bytes(b"other weights")  # weights are not the tokenizer's
    assert prepare_if_raw(raw, tmp_path / "cache", emit=lambda _: None) == (second, "reused")


def test_the_interruption_path_imports_nothing_and_sends_at_once(tmp_path):
    job = Job(root=tmp_path, log=tmp_path / "launcher.log")
    sup = Supervisor(job, triggers=(InterruptAt(step=3),), hard_kill=False, progress="none", emit=lambda _: None,
                     resume_hint="")
    sup.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    before = set(sys.modules)
    event = sup._interrupt(InterruptAt(step=3), 3, 0)
    assert set(sys.modules) - before == set()
    assert sup.proc.returncode == -15 and event["kind"] == "sigterm" and event["signalled_at_step"] == 3
    assert event["late"] == 0 and event["stop_s"] < 5


def test_every_interruption_has_its_lost_time_even_when_the_next_came_before_the_resume():
    timeline = {"wall_s": 100.0, "interruptions": [
        {"at_s": 10.0, "resumed_s": 30.0},  # resumed, then interrupted again
        {"at_s": 40.0},  # interrupted again before training passed its step
        {"at_s": 45.0, "resumed_s": 60.0},
        {"at_s": 90.0}]}  # the run ended (finished its steps) before passing it
    finish_lost_time(timeline)
    assert [e["lost_s"] for e in timeline["interruptions"]] == [20.0, 5.0, 15.0, 10.0]


def test_interrupt_triggers_sort_steps_then_seconds():
    triggers = [InterruptAt.parse(t) for t in ("30", "5s", "4", "2s")]
    assert [str(t) for t in sorted(triggers, key=InterruptAt.sort_key)] == ["step 4", "step 30", "2s", "5s"]



def test_a_job_whose_launcher_still_runs_is_not_resumed_beside_it(tmp_path):
    from spotrun.local.supervisor import LocalRunError

    job = Job(root=tmp_path, log=tmp_path / "launcher.log")
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "spotrun_trainer.launcher",
                             "train", "--sm-root", str(job.sm)])
    try:
        # NOTE: Popen can return before the child's exec shows in /proc/PID/cmdline (seen empty under pytest);
        # a launcher left behind has long been running, so wait for the command line to be there.
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{left.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        sup = Supervisor(job, triggers=(), hard_kill=False, progress="none", emit=lambda _: None, resume_hint="")
        with pytest.raises(LocalRunError, match=f"still running \\(launcher pid {left.pid}\\)"):
            sup.run()
    finally:
        left.kill()
        left.wait()


def test_an_interruption_due_after_the_last_step_is_not_sent_nor_counted(tmp_path):
    job = Job(root=tmp_path, log=tmp_path / "launcher.log")
    sup = Supervisor(job, triggers=(InterruptAt(step=12),), hard_kill=False, progress="none", emit=lambda _: None,
                     resume_hint="")
    sup.progress.total = 12  # as read from the trainer's run_start line
    sup.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert sup._interrupt(InterruptAt(step=12), 12, 0) is None
        assert sup.proc.poll() is None  # no signal: the export after the last step goes on
        assert sup.timeline["not_injected"] == [{"trigger": "step 12",
                                                 "reason": "training had reached its last step (12) when it came due"}]
    finally:
        sup.proc.kill()
        sup.proc.wait()
