"""The `spotrun` command (also `python -m spotrun ...`): `spotrun --help` lists every subcommand.

    validate, estimate       check and estimate runs here (spotrun/cli/estimate.py)
    prepare, upload-model    data and models into shards / the stage's bucket (spotrun/cli/data.py)
    local, demo              the pipeline on this machine (spotrun/cli/local.py)
    simulate                 replay a run's plan over spot traces under each policy (spotrun/policy/)
    start, status, logs, report, cancel, list
                             a deployed stage's runs (spotrun/cli/remote.py)
    approve, deploy, undeploy
                             a finished run's model to a SageMaker endpoint (spotrun/cli/deploy.py)
    catalog update           a region's prices from AWS's price list (spotrun/cli/catalog.py)

Every command reads a run file with spotrun.contract.runfile.load_run_file and exits with a code of the one table in
spotrun/cli/exits.py, which `spotrun --help` prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from .arguments import OneLineErrors
from .catalog import register as register_catalog
from .data import register as register_data
from .deploy import register as register_deploy
from .estimate import register as register_estimate
from .exits import HELP as EXIT_CODES_HELP
from .exits import Exit, fail
from .local import register as register_local
from .remote import register as register_remote
from .simulate import register as register_simulate


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(prog="spotrun", description="spotrun: plan and run spot fine-tunes",
                                     epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"spotrun {_version()}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    register_estimate(sub)
    register_data(sub)
    register_local(sub)
    register_remote(sub)
    register_deploy(sub)
    register_simulate(sub)
    register_catalog(sub)
    return parser


def _version() -> str:
    try:
        return version("spotrun")
    except PackageNotFoundError:
        return "(not installed: run from a checkout)"


# What a command imports only when it runs, and where each comes from: a missing one is a setup problem, said in
# one line (an install of the CLI alone has none of them; `make venv` installs them all).
OPTIONAL_MODULES = {"spotrun_trainer": "the trainer package: pip install -e training_image (make venv does)",
                    "torch": "training_image/requirements.txt (make venv installs it)",
                    "transformers": "training_image/requirements.txt (make venv installs it)",
                    "tokenizers": "training_image/requirements.txt (make venv installs it)",
                    "pyarrow": "training_image/requirements.txt (make venv installs it)",
                    "matplotlib": "requirements-dev.txt (make venv installs it)"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in OPTIONAL_MODULES:
            raise
        message = f"spotrun {args.cmd} needs {top}, which is not installed: {OPTIONAL_MODULES[top]}"
        if getattr(args, "format", "text") == "json":  # every error under --format json is its JSON document
            return fail("json", Exit.FAILED, "MissingPackage", message)
        print(f"error: {message}", file=sys.stderr)
        return int(Exit.FAILED)
    except KeyboardInterrupt:  # Ctrl-C in a command without its own handling (estimate, simulate, ...): one line
        message = f"Ctrl-C: spotrun {args.cmd} stopped before it finished (run it again)"
        if getattr(args, "format", "text") == "json":
            return fail("json", Exit.STOPPED, "Stopped", message)
        print(f"stopped: {message}", file=sys.stderr)
        return int(Exit.STOPPED)
    except BrokenPipeError:  # the reader (`| head`) closed the pipe: not an error of the command

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 0


if __name__ == "__main__":
    sys.exit(main())
