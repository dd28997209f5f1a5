"""The command line's argument parser: argparse, with its own errors as one line in the form of every other refusal
(`error: InvalidArguments: <flag>=<value> is invalid: <what it takes>`, exit 2) instead of a usage block; under
`--format json` the same error is the one JSON document every command prints (spotrun/cli/exits.py `error_doc`,
on stdout, exit 2).

NOTE: argparse reads a value starting with '-' that is not a plain negative number (`--interrupt-at -5s`) as a
flag and reports only "expected one argument"; the error then names the value the user gave and, through the
flag's own type, what the flag takes.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path
from typing import NoReturn

from ..contract.strict_json import dumps as strict_dumps
from .exits import Exit, error_doc


class OneLineErrors(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the flag, the value and what it takes; subparsers made by
    `add_subparsers` are of the same class."""

    def parse_known_args(self, args=None, namespace=None):
        self.given = list(sys.argv[1:] if args is None else args)  # the tokens an error quotes
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        line = f"{self._one_line(message)} (`{self._command()} --help` lists the flags)"
        if self._wants_json():
            print(strict_dumps(error_doc("InvalidArguments", line, _flag(message)), indent=2))
            self.exit(int(Exit.INVALID))
        self.exit(int(Exit.INVALID), f"error: InvalidArguments: {line}\n")

    def _command(self) -> str:
        """The (sub)command the tokens name: an unknown flag is reported by the top parser, but the flags it may
        have meant are in the subcommand's `--help`."""
        parser = self
        for token in getattr(self, "given", []):
            # NOTE: argparse keeps a parser's subcommands on its one _SubParsersAction (no public lookup exists)
            sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            if sub is None:
                break
            parser = sub.choices.get(token, parser)
        return parser.prog

    def _wants_json(self) -> bool:
        """Whether the command line asks for `--format json` (its own errors then are JSON too)."""
        tokens = getattr(self, "given", [])
        return "--format=json" in tokens or any(a == "--format" and b == "json"
                                                 for a, b in zip(tokens, tokens[1:], strict=False))

    def _one_line(self, message: str) -> str:
        named = re.fullmatch(r"argument ([^:]+): (.*)", message, re.S)
        if not named:
            return message
        flag, detail = named[1].split("/")[-1], named[2]
        if detail.startswith(flag):  # the flag's type names it, its value and what it takes
            return detail
        typed = re.fullmatch(r"invalid (int|float) value: '(.*)'", detail, re.S)
        if typed:  # argparse's own words for a type: int() and float()
            what = "a whole number (e.g. 1000)" if typed[1] == "int" else "a number (e.g. 0.5)"
            return f"{flag}={as_typed(typed[2])} is invalid: expected {what}"
        choice = re.fullmatch(r"invalid choice: '?(.*?)'? \(choose from (.*)\)", detail, re.S)
        if choice and flag.startswith("-"):  # argparse quotes the choices as Python does: unquoted here
            options = ", ".join(c.strip().strip("'") for c in choice[2].split(","))
            return f"{flag}={as_typed(choice[1])} is invalid: expected one of {options}"
        if detail != "expected one argument":
            return message
        tokens = getattr(self, "given", [])
        value = next((b for a, b in zip(tokens, tokens[1:], strict=False) if a == flag), None)
        # NOTE: _option_string_actions is argparse's table of flags (no public lookup exists)
        action = self._option_string_actions.get(flag)
        if value is None or not value.startswith("-"):
            return f"{flag} needs a value ({(action.metavar if action else None) or 'one argument'})"
        if action is not None and callable(action.type):
            try:
                action.type(value)
            except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
                if str(exc).startswith(flag):
                    return str(exc)
        return (f"{flag}={as_typed(value)} is invalid: a value starting with '-' is read as a flag; write "
                f"{flag}={as_typed(value)}")


def as_typed(value: str) -> str:
    """A command-line value as the user typed it (`--format=xml`, `--set='a b'`): quoted only where a shell needs
    it, never Python's repr (`--format='xml'`)."""
    return shlex.quote(str(value))


def _flag(message: str) -> str | None:
    """The flag an argparse error is about (`argument --nproc: ...`, the first of `unrecognized arguments: --bogus`),
    None for a positional or none."""
    unknown = re.match(r"unrecognized arguments: (\S+)", message)
    if unknown and unknown[1].startswith("-"):
        return unknown[1].split("=")[0]
    named = re.match(r"argument ([^:\s]+):", message)
    flag = named[1].split("/")[-1] if named else None
    return flag if flag and flag.startswith("-") else None


def run_file(name: str):
    """The argparse type of a command's run file argument (`name`, as its error names it): a path, refused where it
    is empty (`spotrun validate ""` read the current directory, '.', and called it the run file: issue #26)."""

    def parse(text: str) -> Path:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{name}={json.dumps(text)} is invalid: expected a run JSON file's "
                                             "path (the argument is empty)")
        return Path(text)

    return parse
