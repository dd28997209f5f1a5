"""The command line's argument parser: argparse, with its own errors as one line in the form of every other refusal
(`error: InvalidArguments: <flag>=<value> is invalid: <what it takes>`, exit 2) instead of a usage block.

NOTE: argparse reads a value starting with '-' that is not a plain negative number (`--interrupt-at -5s`) as a
flag and reports only "expected one argument"; the error then names the value the user gave and, through the
flag's own type, what the flag takes.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import NoReturn


class OneLineErrors(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the flag, the value and what it takes; subparsers made by
    `add_subparsers` are of the same class."""

    def parse_known_args(self, args=None, namespace=None):
        self.given = list(sys.argv[1:] if args is None else args)  # the tokens an error quotes
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: InvalidArguments: {self._one_line(message)} (`{self.prog} --help` lists the flags)\n")

    def _one_line(self, message: str) -> str:
        named = re.fullmatch(r"argument ([^:]+): (.*)", message, re.S)
        if not named:
            return message
        flag, detail = named[1].split("/")[-1], named[2]
        if detail.startswith(flag):  # the flag's type names it, its value and what it takes
            return detail
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
        return f"{flag}={value!r} is invalid: a value starting with '-' is read as a flag; write {flag}={value}"
