"""The `spotrun local` and `spotrun demo` subcommands: arguments and exit codes (logic in pipeline.py, demo.py).

Exit codes: 0 done; 2 invalid run or arguments; 3 refused by the planner (over budget); 1 training failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _interrupt(text: str):
    from .pipeline import InterruptAt

    try:
        return InterruptAt.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--set={text!r} is invalid: expected KEY=VALUE (a trainer hyperparameter, "
                                         "e.g. checkpoint.interval_steps=10)")
    return key.strip(), value


def register(sub) -> None:
    loc = sub.add_parser("local", help="run a run JSON end to end on this machine (no AWS): estimate, prepare, "
                         "train with injected spot interruptions, register, report")
    loc.add_argument("run", type=Path, help="run JSON file (local model.source / data.source, relative to it)")
    loc.add_argument("--out", type=Path, default=Path("runs"), help="job directories and the local registry "
                     "(default ./runs)")
    loc.add_argument("--interrupt-at", action="append", type=_interrupt, default=[], metavar="STEP|SECONDSs",
                     help="interrupt when the run reaches STEP, or SECONDS after the start (e.g. 30s); repeatable")
    loc.add_argument("--hard-kill", action="store_true", help="interrupt by SIGKILL of the whole process tree (an "
                     "instance vanishing) instead of SIGTERM (SageMaker's stop notice)")
    loc.add_argument("--nproc", type=int, default=2, help="worker processes (default 2)")
    loc.add_argument("--set", dest="overrides", action="append", type=_setting, default=[], metavar="KEY=VALUE",
                     help="trainer hyperparameter on top of the planner's; repeatable")
    loc.add_argument("--job-name", help="job directory name under --out (default <run name>-<time>)")
    loc.add_argument("--progress", choices=["auto", "bar", "lines", "none"], default="auto",
                     help="a progress bar on a terminal, plain lines otherwise (default auto)")
    loc.add_argument("--format", choices=["text", "json"], default="text", help="the final report as text "
                     "(default) or JSON")
    loc.set_defaults(func=local_command)

    demo = sub.add_parser("demo", help="`make demo`: the example run of examples/demo/ with one spot interruption, "
                          "then uninterrupted; compares the registered weights bit for bit")
    demo.add_argument("--out", type=Path, default=Path("demo-output"), help="output directory (default demo-output)")
    demo.add_argument("--interrupt-at", type=_interrupt, default=None, metavar="STEP|SECONDSs",
                      help="when to interrupt (default step 30)")
    demo.add_argument("--progress", choices=["auto", "bar", "lines", "none"], default="auto")
    demo.set_defaults(func=demo_command)


def _guarded(run) -> int:
    from ..contract import RunValidationError
    from ..planner import EstimateRefused
    from .pipeline import LocalRunError

    try:
        return run()
    except RunValidationError as exc:
        print(f"error: InvalidRun: {exc}", file=sys.stderr)
        return 2
    except EstimateRefused as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return 3
    except LocalRunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def local_command(args: argparse.Namespace) -> int:
    from ..report import summary_text
    from .pipeline import LocalOptions, run_local

    if args.nproc < 1:
        print(f"error: --nproc={args.nproc} is invalid: expected an integer >= 1", file=sys.stderr)
        return 2
    options = LocalOptions(out=args.out, interrupts=tuple(args.interrupt_at), hard_kill=args.hard_kill,
                           nproc=args.nproc, overrides=dict(args.overrides), job_name=args.job_name,
                           progress=args.progress)
    quiet = args.format == "json"

    def emit(line: str) -> None:
        print(line, file=sys.stderr if quiet else sys.stdout, flush=True)

    def go() -> int:
        report = run_local(args.run, options, emit=emit)
        if quiet:
            print(json.dumps(report, indent=2))
        else:
            print(summary_text(report))
            for name, path in report["files"].items():
                print(f"  {name:<16} {path}")
        return 4 if report["status"] == "GateFailed" else 0  # trained, but not registered: the gate said no

    return _guarded(go)


def demo_command(args: argparse.Namespace) -> int:
    from .demo import run_demo

    def go() -> int:
        kwargs = {"interrupt_at": args.interrupt_at} if args.interrupt_at else {}
        summary = run_demo(args.out, progress=args.progress, **kwargs)
        return 0 if summary["weights_bitwise_identical"] and summary["gate_passed"] is not False else 1

    return _guarded(go)
