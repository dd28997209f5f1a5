"""Infrastructure fixtures on top of the one synth of the whole app (tests/conftest.py: `synth`): its template as
an `aws_cdk.assertions.Template` (built once from that synth, never synthesized again) and the state machine's
definition."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def template(synth):
    """The stack's template for `aws_cdk.assertions` (has_resource_properties, find_resources, Match, Capture)."""
    from aws_cdk.assertions import Template

    return Template.from_json(synth.template)


@pytest.fixture(scope="session")
def definition(template) -> dict:
    """The state machine's DefinitionString as a dict, intrinsics left in place as placeholders."""
    from aws_cdk.assertions import Capture

    from tests.infra.render import placeholder, render

    template.resource_count_is("AWS::StepFunctions::StateMachine", 1)
    body = Capture()
    template.has_resource_properties("AWS::StepFunctions::StateMachine", {"DefinitionString": body})
    return json.loads(render(body.as_object(), placeholder))
