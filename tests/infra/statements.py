"""IAM statements of the synthesized template, found through `aws_cdk.assertions.Template` (shared by
test_stack.py and test_security.py)."""

from __future__ import annotations

from aws_cdk.assertions import Match, Template


def as_list(x) -> list:
    """An IAM Action/Resource value as a list (a single one is written as a scalar)."""
    return x if isinstance(x, list) else [x]


def role_statements(template: Template, role: str) -> list[dict]:
    """Every statement of every AWS::IAM::Policy attached to the role with logical ID `role`."""
    policies = template.find_resources("AWS::IAM::Policy", {"Properties": {"Roles": Match.array_with([{"Ref": role}])}})
    assert policies, f"no policy is attached to {role}"
    return [s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]]


def role_named(template: Template, prefix: str) -> str:
    """The logical ID of the one AWS::IAM::Role whose ID starts with `prefix` (a construct path, hash aside)."""
    found = [lid for lid in template.find_resources("AWS::IAM::Role") if lid.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    return found[0]


def actions(statements: list[dict]) -> set[str]:
    return {a for s in statements for a in as_list(s["Action"])}
