#!/usr/bin/env python3
"""The spotrun CDK app: one Stage per entry of stacks/config.py, checked by cdk-nag (AwsSolutions).

`python app.py` synthesizes into cdk.out without the CDK CLI, AWS credentials or Docker.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks

from stacks.config import ENVIRONMENTS, AccountConfig, check_environments
from stacks.stage import SpotrunStage

ROOT = Path(__file__).resolve().parent


def cdk_json_context() -> dict:
    """Feature flags from cdk.json: the CDK CLI passes them itself; `python app.py` alone must read them."""
    return json.loads((ROOT / "cdk.json").read_text()).get("context", {})


def build_app(environments: tuple[AccountConfig, ...] = ENVIRONMENTS, outdir: str | None = None,
              context: dict | None = None) -> App:
    check_environments(environments)
    app = App(outdir=outdir, context=context if context is not None else cdk_json_context())
    for config in environments:
        SpotrunStage(app, config.stage, config=config)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app


if __name__ == "__main__":
    # The CDK CLI sets CDK_OUTDIR; `python app.py` alone writes to ./cdk.out.
    under_cli = "CDK_CONTEXT_JSON" in os.environ  # the CLI already merged cdk.json's context
    build_app(outdir=os.environ.get("CDK_OUTDIR", str(ROOT / "cdk.out")),
              context={} if under_cli else None).synth()
