"""The `spotrun` command (also `python -m spotrun ...`): `spotrun --help` lists every subcommand.

    estimate RUN.json...     the planner's estimate (here)
    local RUN.json, demo     the pipeline on this machine (spotrun/local/commands.py)
    start, status, logs, report, cancel, list
                             a deployed stage's runs (spotrun/remote.py)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .contract import RunValidationError, parse_run
from .local.commands import register as register_local
from .planner import Estimate, EstimateRefused, estimate, format_text
from .remote import register as register_remote
from .sources import resolve


def estimate_file(path: Path) -> dict:
    """Estimate one run file; raises RunValidationError / EstimateRefused."""
    try:
        raw = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise RunValidationError("run", str(path), f"valid JSON ({exc.msg} at line {exc.lineno})") from None
    run = parse_run(raw)
    model_config, tokens = resolve(run)
    return {"run": run, "estimate": estimate(run, model_config=model_config, data_tokens=tokens)}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("spotrun")
    except PackageNotFoundError:
        return "(not installed: run from a checkout)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spotrun", description="spotrun: plan and run spot fine-tunes")
    parser.add_argument("--version", action="version", version=f"spotrun {_version()}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    est = sub.add_parser("estimate", help="estimate instance, time limits, checkpoint cadence and cost of run(s)")
    est.add_argument("runs", nargs="+", type=Path, help="run JSON file(s)")
    est.add_argument("--format", choices=["text", "json"], default="text",
                     help="text table (default) or JSON: one document, an array of them for several files")
    register_local(sub)
    register_remote(sub)
    args = parser.parse_args(argv)
    if args.cmd != "estimate":
        return args.func(args)

    status = 0
    documents = []  # --format json: one document; with several files, an array of {"file": ..., ...}
    for path in args.runs:
        try:
            result = estimate_file(path)["estimate"].to_json()
        except OSError as exc:
            result, status = {"error": "InvalidRun", "message": f"{path}: {exc.strerror}"}, 2
        except RunValidationError as exc:
            result, status = {"error": "InvalidRun", "field": exc.field, "message": str(exc)}, 2
        except EstimateRefused as exc:
            result, status = {"error": exc.code, "message": exc.message,
                              "estimate": exc.estimate.to_json() if exc.estimate else None}, 3
        if args.format == "json":
            documents.append({"file": str(path), **result} if len(args.runs) > 1 else result)
        elif "error" in result:
            print(f"{path}: {result['error']}: {result['message']}", file=sys.stderr)
        else:
            print(f"== {path}")
            print(format_text(Estimate(**result)))
    if documents:
        print(json.dumps(documents if len(args.runs) > 1 else documents[0], indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
