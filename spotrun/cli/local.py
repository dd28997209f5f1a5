"""The `spotrun local` and `spotrun demo` subcommands: arguments and exit codes (logic in pipeline.py, demo.py).

Exit codes (spotrun/cli/exits.py): 0 done; 2 invalid run, arguments or configuration (found before any worker starts,
or by the launcher); 3 refused by the planner (over budget); 1 training failed; 4 trained but refused by
registry.gate; 130 stopped by Ctrl-C, SIGTERM or SIGHUP (the job saved a checkpoint: `spotrun local --resume JOB`
continues it).
With `--format json` an error is one JSON document on stdout, as the report is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from ..contract.refusal import Refusal
from ..contract.strict_json import dumps as strict_dumps
from ..local.demo import run_demo
from ..local.pipeline import (
    LOCAL_OUT,
    LocalConfigError,
    LocalOptions,
    LocalRunError,
    LocalStopped,
    resume_local,
    run_local,
)
from ..local.supervisor import MAX_RESTARTS, InterruptAt
from ..pipeline.report import summary_text
from ..policy.traces import interruption_times, read_availability
from .arguments import as_typed, run_file
from .exits import Exit, fail, for_status

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # one path component, never .. or /
TRACE_SPEEDUP = 3600.0  # --trace-speedup's default: a trace hour per local second


def _interrupt(text: str):
    try:
        return InterruptAt.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--set={as_typed(text)} is invalid: expected KEY=VALUE (a trainer "
                                         "hyperparameter, e.g. checkpoint.interval_steps=10)")
    return key.strip(), value


def register(sub) -> None:
    loc = sub.add_parser("local", help="run a run JSON end to end on this machine (no AWS): estimate, prepare, "
                         "train with injected spot interruptions, register, report")
    loc.add_argument("run", type=run_file("run"), nargs="?", help="run JSON file (local model.source / "
                     "data.source, relative to it); not with --resume")
    loc.add_argument("--resume", metavar="JOB", help="continue an interrupted or stopped local job (its name under "
                     "--out, or its directory) on its checkpoints")
    loc.add_argument("--out", type=Path, default=LOCAL_OUT, help="job directories, the local registry and the "
                     f"prepared text (default ./{LOCAL_OUT}; `estimate` and `simulate` reuse ./{LOCAL_OUT}/prepared)")
    loc.add_argument("--interrupt-at", action="append", type=_interrupt, default=[], metavar="STEP|SECONDSs",
                     help="interrupt when the run reaches STEP, or SECONDS after the start (e.g. 30s); repeatable")
    loc.add_argument("--trace", type=Path, help="also interrupt where this availability trace (skypilot-org/"
                     "spot-traces format) loses capacity, in its running time / --trace-speedup")
    loc.add_argument("--trace-speedup", type=float, default=None, help="with --trace: trace seconds per local "
                     f"second (default {TRACE_SPEEDUP:g}: a trace hour per second)")
    loc.add_argument("--hard-kill", action="store_true", help="interrupt by SIGKILL of the whole process tree (an "
                     "instance vanishing) instead of SIGTERM (SageMaker's stop notice)")
    loc.add_argument("--nproc", type=int, default=None, help="worker processes (default 2, or 1 when the plan's "
                     "samples per optimizer step are odd); they share those samples, so it must divide them")
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


def _guarded(run, fmt: str = "text") -> int:
    """Run a command; every way it can end is one exit code of spotrun/cli/exits.py and one line on stderr (or, with
    `--format json`, one JSON document on stdout)."""
    try:
        return run()
    except Refusal as exc:  # the contract, the sources or the planner
        return _end(fmt, for_status(exc.status), exc.status, exc.message, f"error: {exc.status}: {exc.message}",
                    exc.field)
    except LocalStopped as exc:
        line = f"stopped by {exc.by} {exc}. Resume with: {exc.resume_hint}"
        return _end(fmt, Exit.STOPPED, "Stopped", line, line)
    except LocalConfigError as exc:
        return _end(fmt, Exit.INVALID, "InvalidConfiguration", str(exc), f"error: InvalidConfiguration: {exc}")
    except LocalRunError as exc:
        return _end(fmt, Exit.FAILED, "TrainingFailed", str(exc), f"error: {exc}")
    except KeyboardInterrupt:  # before training started: nothing to save
        message = "Ctrl-C before training started; nothing to resume"
        return _end(fmt, Exit.STOPPED, "Stopped", message, f"stopped: {message}")


def _end(fmt: str, code, error: str, message: str, line: str, field: str | None = None) -> int:
    """The JSON error document on stdout (`--format json`), or the line on stderr; returns the exit code."""
    if fmt == "json":
        return fail(fmt, code, error, message, field)
    print(line, file=sys.stderr)
    return int(code)


def trace_interrupts(path: Path, speedup: float):
    """--trace: the trace's losses of capacity as injected interruptions (seconds after the start)."""
    if not speedup > 0:
        raise ValueError(f"--trace-speedup={as_typed(speedup)} is invalid: expected a number > 0")
    rec = read_availability(path)
    open_end = [(a, b if b < rec.length_s else float("inf")) for a, b in rec.windows]  # the recording just ends
    times = interruption_times(open_end, MAX_RESTARTS)
    return tuple(InterruptAt(seconds=round(t / speedup, 3)) for t in times if t / speedup > 0)


def local_command(args: argparse.Namespace) -> int:
    if args.trace_speedup is not None and args.trace is None:
        return _bad_argument(args.format, f"--trace-speedup={args.trace_speedup:g} is invalid: expected only with "
                             "--trace FILE (it scales the trace's time)", "--trace-speedup")
    twice = next((t for i, t in enumerate(args.interrupt_at) if t in args.interrupt_at[:i]), None)
    if twice is not None:
        given = twice.step if twice.step is not None else f"{twice.seconds:g}s"
        return _bad_argument(args.format, f"--interrupt-at={given} is invalid: expected each step or time once (given "
                             f"{args.interrupt_at.count(twice)} times: the repeat would stop the resumed job again as "
                             "soon as it starts)", "--interrupt-at")
    speedup = TRACE_SPEEDUP if args.trace_speedup is None else args.trace_speedup
    try:  # --trace: after the --interrupt-at points (the pipeline takes them in order)
        args.interrupt_at = [*args.interrupt_at, *trace_interrupts(args.trace, speedup)] if args.trace \
            else args.interrupt_at
    except ValueError as exc:
        return _bad_argument(args.format, str(exc), "--trace")
    if args.nproc is not None and args.nproc < 1:
        return _bad_argument(args.format, f"--nproc={args.nproc} is invalid: expected an integer >= 1", "--nproc")
    if args.hard_kill and not args.interrupt_at:
        return _bad_argument(args.format, "--hard-kill is invalid: expected with --interrupt-at or --trace (it says "
                             "how their interruptions stop the job; alone it changes nothing)", "--hard-kill")
    if args.job_name is not None and not JOB_NAME.fullmatch(args.job_name):
        return _bad_argument(args.format, f"--job-name={json.dumps(args.job_name)} is invalid: expected one "
                             "directory name under --out: 1-128 letters, digits, '.', '_' or '-', starting with a "
                             "letter or digit", "--job-name")
    if _a_file(args.out):
        return _bad_argument(args.format, _a_file(args.out), "--out")
    if (args.run is None) == (args.resume is None):
        return _bad_argument(args.format, "spotrun local needs a run JSON file, or --resume JOB (not both)", "run")
    options = LocalOptions(out=args.out, interrupts=tuple(args.interrupt_at), hard_kill=args.hard_kill,
                           nproc=args.nproc, overrides=dict(args.overrides), job_name=args.job_name,
                           progress=args.progress, hub_endpoint=os.environ.get("HF_ENDPOINT"))
    quiet = args.format == "json"

    def emit(line: str) -> None:
        print(line, file=sys.stderr if quiet else sys.stdout, flush=True)

    def go() -> int:
        report = resume_local(args.resume, options, emit=emit) if args.resume else \
            run_local(args.run, options, emit=emit)
        if quiet:
            print(strict_dumps(report, indent=2))
        else:
            print(summary_text(report))
            for name, path in report["files"].items():
                print(f"  {name:<16} {path}")
        # trained, but not registered: the gate said no
        return int(Exit.GATE_FAILED if report["status"] == "GateFailed" else Exit.OK)

    return _guarded(go, args.format)


def _a_file(out: Path) -> str:
    """The refusal of an --out that is a file (else ''): found before anything is prepared or trained."""
    if out.exists() and not out.is_dir():
        return (f"--out={json.dumps(str(out))} is invalid: expected a directory (or a path to create one at): it is "
                "a file")
    return ""


def _bad_argument(fmt: str, message: str, field: str) -> int:
    return _end(fmt, Exit.INVALID, "InvalidArguments", message, f"error: InvalidArguments: {message}", field)


def demo_command(args: argparse.Namespace) -> int:
    if _a_file(args.out):
        return _bad_argument("text", _a_file(args.out), "--out")

    def go() -> int:
        kwargs = {"interrupt_at": args.interrupt_at} if args.interrupt_at else {}
        summary = run_demo(args.out, progress=args.progress, **kwargs)
        return int(Exit.OK if summary["weights_bitwise_identical"] and summary["gate_passed"] is not False
                   else Exit.FAILED)

    return _guarded(go)
