"""cdk-nag v3 acknowledgments: one finding each, with its reason, attached to the resource it covers."""

from __future__ import annotations

import re

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding (e.g. `AwsSolutions-IAM5[Resource::*]`) on `scope` with a reason."""
    Validations.of(scope).acknowledge(Acknowledgment(id=finding, reason=reason))


def rendered(scope: IConstruct, value: str) -> str:
    """A token string as cdk-nag prints it in finding ids (`<LogicalId.Arn>/datasets/*`, `<AWS::Partition>`, a
    policy variable `${aws:PrincipalTag/run}` as `<aws:PrincipalTag/run>`).

    Only for same-stack references (the app has one stack per stage)."""
    def render(v) -> str:
        if isinstance(v, str):
            return re.sub(r"\$\{([^}]*)\}", r"<\1>", v)
        if isinstance(v, dict) and "Fn::GetAtt" in v:
            return f"<{v['Fn::GetAtt'][0]}.{v['Fn::GetAtt'][1]}>"
        if isinstance(v, dict) and "Ref" in v:
            return f"<{v['Ref']}>"
        if isinstance(v, dict) and "Fn::Join" in v:
            sep, parts = v["Fn::Join"]
            return sep.join(render(p) for p in parts)
        raise ValueError(f"cannot render {v!r} as a cdk-nag finding")

    return render(Stack.of(scope).resolve(value))
