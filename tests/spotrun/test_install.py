"""The `spotrun` command from a non-editable install (pip's wheel of pyproject.toml, into a directory of its own),
run away from the checkout with the trainer package, the CDK app and the constructs made unimportable: every
command parses, `validate` and `estimate` run, and `spotrun status` reads the trainer's metric lines with the
installed package alone (the line's parser is spotrun.seams', not the trainer's)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Runs the installed CLI with everything outside the `spotrun` package refused at import.
DRIVER = '''
import importlib.abc, json, sys, time

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in ("spotrun_trainer", "training_constructs", "stacks", "app", "tests"):
            # what Python raises for a module that is not installed
            raise ModuleNotFoundError(f"No module named {name!r} (not part of the installed spotrun package)",
                                      name=name)

sys.meta_path.insert(0, Refuse())
import spotrun
from spotrun.cli.main import build_parser, main

print("package", spotrun.__file__)
if sys.argv[1] == "--every-help":
    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    for command in sub.choices:
        try:
            main([command, "--help"])
        except SystemExit as exc:
            print("help", command, exc.code)
elif sys.argv[1] == "--status-metrics":
    import boto3
    from moto import mock_aws

    from spotrun.cli.remote import TRAINING_LOG_GROUP, latest_metrics

    with mock_aws():
        logs = boto3.client("logs", region_name="us-east-1")
        logs.create_log_group(logGroupName=TRAINING_LOG_GROUP)
        logs.create_log_stream(logGroupName=TRAINING_LOG_GROUP, logStreamName="job-1/algo-1")
        lines = json.loads(sys.argv[2])
        now = int(time.time() * 1000)
        logs.put_log_events(logGroupName=TRAINING_LOG_GROUP, logStreamName="job-1/algo-1",
                            logEvents=[{"timestamp": now + i, "message": m} for i, m in enumerate(lines)])
        print("metrics", json.dumps(latest_metrics(logs, "job-1")))
else:
    sys.exit(main(sys.argv[1:]))
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """pip's non-editable install of a copy of the package's sources (the checkout stays untouched)."""
    root = tmp_path_factory.mktemp("install")
    (root / "src").mkdir()
    shutil.copy(REPO / "pyproject.toml", root / "src" / "pyproject.toml")
    shutil.copytree(REPO / "spotrun", root / "src" / "spotrun", ignore=shutil.ignore_patterns("__pycache__"))
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          "--no-deps", "--no-build-isolation", "--target", str(root / "site"), str(root / "src")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (root / "drive.py").write_text(DRIVER)
    return root


def _spotrun(installed: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(installed / "site"), "HOME": str(installed),
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}
    res = subprocess.run([sys.executable, str(installed / "drive.py"), *args], cwd=installed, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.stdout.startswith(f"package {installed / 'site' / 'spotrun' / '__init__.py'}\n"), res.stdout + res.stderr
    return res


def test_every_command_parses_from_a_non_editable_install(installed):
    res = _spotrun(installed, "--every-help")
    assert res.returncode == 0, res.stderr[-3000:]
    helped = {line.split()[1]: line.split()[2] for line in res.stdout.splitlines() if line.startswith("help ")}
    assert {"validate", "estimate", "prepare", "local", "start", "status", "report"} <= set(helped)
    assert set(helped.values()) == {"0"}, helped


def test_validate_and_estimate_run_from_a_non_editable_install(installed):
    run = installed / "run.json"
    shutil.copy(REPO / "examples" / "runs" / "qwen2-0.5b-full-small.json", run)
    for command in ("validate", "estimate"):
        res = _spotrun(installed, command, str(run))
        assert res.returncode == 0 and f"== {run}: ok" in res.stdout, (command, res.stdout, res.stderr[-3000:])


def test_status_reads_the_trainers_metric_lines_from_a_non_editable_install(installed):
    lines = ["run_start params=1000 world=1 blocks=2 start_step=0 total_steps=40 device=cuda",
             "step=10 loss=3.2500 lr=1.000e-04 grad_norm=0.5000 tokens_per_s=900 mfu=0.300 mem_gb=2.00",
             "step=20 loss=2.7500 lr=1.000e-04 grad_norm=0.4000 tokens_per_s=950 mfu=na mem_gb=2.00"]
    res = _spotrun(installed, "--status-metrics", json.dumps(lines))
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads(next(line for line in res.stdout.splitlines() if line.startswith("metrics "))[8:])
    assert metrics == {"step": 20, "loss": 2.75, "lr": 1e-4, "grad_norm": 0.4, "tokens_per_s": 950.0, "mfu": None,
                       "mem_gb": 2.0, "total_steps": 40}


def test_a_command_needing_the_trainer_says_so_in_one_line_from_an_install_without_it(installed):
    """`prepare` and `local` run the trainer package, which an install of the CLI alone lacks: one line naming
    what to install, exit 1 (spotrun.cli.exits: failed), no traceback, and no local job directory left behind."""
    (installed / "raw").mkdir(exist_ok=True)
    (installed / "raw" / "a.jsonl").write_text('{"text": "hello"}\n')
    run = installed / "local-run.json"
    shutil.copy(REPO / "examples" / "runs" / "qwen2-0.5b-full-small.json", run)
    for args in (("prepare", str(installed / "raw"), "--tokenizer", str(installed), "--out", str(installed / "d")),
                 ("local", str(run), "--out", str(installed / "runs"))):
        res = _spotrun(installed, *args)
        assert res.returncode == 1 and "Traceback" not in res.stderr, (args, res.stderr[-3000:])
        assert res.stderr.strip().splitlines()[-1] == (
            f"error: spotrun {args[0]} needs spotrun_trainer, which is not installed: the trainer package: "
            "pip install -e training_image (make venv does)"), res.stderr
    assert not (installed / "runs").exists() and not (installed / "d").exists()
