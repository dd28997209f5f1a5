"""One synth of the whole app (under cdk-nag) shared by every infrastructure test."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


@dataclass
class Synth:
    outdir: Path
    template: dict
    template_path: Path

    def resources(self, cfn_type: str) -> dict[str, dict]:
        return {k: v for k, v in self.template["Resources"].items() if v["Type"] == cfn_type}

    def one(self, cfn_type: str) -> tuple[str, dict]:
        found = self.resources(cfn_type)
        assert len(found) == 1, (cfn_type, list(found))
        return next(iter(found.items()))


@pytest.fixture(scope="session")
def synth(tmp_path_factory) -> Synth:
    from app import build_app

    outdir = tmp_path_factory.mktemp("cdk.out")
    build_app(outdir=str(outdir)).synth()  # raises if cdk-nag reports any unacknowledged finding
    path = next((outdir / "assembly-dev").glob("*.template.json"))
    return Synth(outdir=outdir, template=json.loads(path.read_text()), template_path=path)


@pytest.fixture(scope="session")
def definition(synth) -> dict:
    """The state machine's DefinitionString as a dict, intrinsics left in place as placeholders."""
    from tests.infra.render import placeholder, render

    _, sm = synth.one("AWS::StepFunctions::StateMachine")
    return json.loads(render(sm["Properties"]["DefinitionString"], placeholder))
