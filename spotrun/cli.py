"""`spotrun <command>` (also `python -m spotrun ...`): validate and estimate runs (spotrun/validate.py)."""

from __future__ import annotations

import argparse
import sys

from . import validate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spotrun", description="spotrun: plan and run spot fine-tunes",
                                     epilog=validate.EXIT_CODES_HELP)
    sub = parser.add_subparsers(dest="cmd", required=True)
    validate.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
