"""Infrastructure fixtures on top of the one synth of the whole app (tests/conftest.py: `synth`)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def definition(synth) -> dict:
    """The state machine's DefinitionString as a dict, intrinsics left in place as placeholders."""
    from tests.infra.render import placeholder, render

    _, sm = synth.one("AWS::StepFunctions::StateMachine")
    return json.loads(render(sm["Properties"]["DefinitionString"], placeholder))
