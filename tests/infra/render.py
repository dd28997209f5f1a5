"""Render CloudFormation intrinsics (Ref, Fn::GetAtt, Fn::Join, Fn::Sub, Fn::Select of Fn::Split) into strings.

Used to turn the synthesized DefinitionString into plain ASL: with placeholder ARNs for asl-validator, and with
the ARNs of resources created in moto for executing the state machine.
"""

from __future__ import annotations

import re
from typing import Callable

PSEUDO = {"AWS::Partition": "aws", "AWS::Region": "us-east-1", "AWS::AccountId": "123456789012",
          "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": "dev-Spotrun",
          "AWS::StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/dev-Spotrun/"
                          "0a1b2c3d-0000-4000-8000-000000000000"}


def render(value, resolve: Callable[[str, str | None], str]) -> str:
    """resolve(logical_id, attribute or None for Ref) gives each referenced resource's value."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (fn, arg), = value.items()
        if fn == "Ref":
            return PSEUDO.get(arg) or resolve(arg, None)
        if fn == "Fn::GetAtt":
            return resolve(arg[0], arg[1])
        if fn == "Fn::Join":
            sep, parts = arg
            return sep.join(render(p, resolve) for p in parts)
        if fn == "Fn::Select":
            index, listed = arg
            if not (isinstance(listed, dict) and "Fn::Split" in listed):
                raise ValueError(f"cannot render {value!r}")
            sep, source = listed["Fn::Split"]
            return render(source, resolve).split(sep)[int(index)]
        if fn == "Fn::Sub":
            text = arg if isinstance(arg, str) else arg[0]

            def sub(m: re.Match) -> str:
                name = m.group(1)
                if name in PSEUDO:
                    return PSEUDO[name]
                logical, _, attr = name.partition(".")
                return resolve(logical, attr or None)

            return re.sub(r"\$\{([^}]+)\}", sub, text)
    raise ValueError(f"cannot render {value!r}")


def placeholder(logical_id: str, attribute: str | None) -> str:
    """A syntactically valid stand-in for any resource reference."""
    if attribute is None:
        return f"ref-{logical_id.lower()}"
    return f"arn:aws:lambda:us-east-1:123456789012:function:{logical_id}"
