"""Decide IAM requests with @cloud-copilot/iam-simulate (npm, offline; run by tests/infra/iam_simulate.mjs), the
evaluator for what moto cannot decide: policy variables (`${aws:PrincipalTag/run}`), condition keys of S3 requests
(`s3:prefix`), session tags and trust policies. It also refuses unknown actions, resource ARNs of the wrong type
for the action and malformed policies, so a typo in a test or a policy fails instead of passing as a deny."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("iam_simulate.mjs")
ACCOUNT = "123456789012"


@dataclass(frozen=True)
class Request:
    """One request: who (an ARN), what action on which resource, with which request context."""

    action: str
    resource: str
    principal: str = f"arn:aws:sts::{ACCOUNT}:assumed-role/job-role/job"
    context: dict = field(default_factory=dict)


def decide(policies: list[dict], requests: list[Request], resource_policy: dict | None = None) -> list[str]:
    """Each request's decision ("Allowed", "ImplicitlyDenied", "ExplicitlyDenied") under the principal's identity
    `policies` (and, for a role's trust, its `resource_policy`)."""
    if not (ROOT / "node_modules" / "@cloud-copilot" / "iam-simulate").is_dir():
        pytest.fail("node_modules/@cloud-copilot/iam-simulate missing: run `make node` (make test does it)")
    cases = [{"policies": policies, "action": r.action, "resource": r.resource, "principal": r.principal,
              "account": ACCOUNT, "context": r.context, "resourcePolicy": resource_policy} for r in requests]
    done = subprocess.run(["node", str(SCRIPT)], input=json.dumps({"cases": cases}), text=True, cwd=ROOT,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout)
    errors = [(r, res["errors"]) for r, res in zip(requests, results, strict=True) if "errors" in res]
    assert not errors, errors
    return [res["decision"] for res in results]
