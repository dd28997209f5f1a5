"""`spotrun estimate RUN.json [--format text|json]` (also `python -m spotrun ...`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .contract import RunValidationError, parse_run
from .planner import Estimate, EstimateRefused, estimate, format_text
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spotrun", description="spotrun: plan and run spot fine-tunes")
    sub = parser.add_subparsers(dest="cmd", required=True)
    est = sub.add_parser("estimate", help="estimate instance, time limits, checkpoint cadence and cost of run(s)")
    est.add_argument("runs", nargs="+", type=Path, help="run JSON file(s)")
    est.add_argument("--format", choices=["text", "json"], default="text", help="text table (default) or JSON")
    args = parser.parse_args(argv)

    status = 0
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
            print(json.dumps({"file": str(path), **result} if len(args.runs) > 1 else result, indent=2))
        elif "error" in result:
            print(f"{path}: {result['error']}: {result['message']}", file=sys.stderr)
        else:
            print(f"== {path}")
            print(format_text(Estimate(**result)))
    return status


if __name__ == "__main__":
    sys.exit(main())
