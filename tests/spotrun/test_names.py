"""Every name the pipeline derives from a run's name fits the API that receives it, as botocore's service models
state it (length and pattern, full-matched), for every run name the contract accepts: the execution's name
(StartExecution), each segment's training job (CreateTrainingJob), the preparation job (CreateProcessingJob), and the
serving model, endpoint config and endpoint (`spotrun deploy`). S3 keys in a run cannot climb out of their prefix."""

from __future__ import annotations

import time

import botocore.session
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from spotrun.cli.deploy import resource_name
from spotrun.cli.remote import execution_name
from spotrun.contract.spec import _NAME, parse_run
from spotrun.contract.strict_json import RunValidationError
from spotrun.pipeline.plan import job_name
from spotrun.pipeline.preflight import check_execution_name
from spotrun.pipeline.preparation import job_name as preparation_job_name
from spotrun.planner.segments import MAX_SEGMENTS, segment_job_name
from stacks.config import MAX_JOB_PREFIX

_SESSION = botocore.session.get_session()
_SFN = _SESSION.get_service_model("stepfunctions")
_SM = _SESSION.get_service_model("sagemaker")
RUN = {"version": 1, "name": "n", "model": {"config": {"model_type": "llama"}},
       "data": {"tokens": 1000, "seq_len": 128}, "budget": {"max_usd": 5}}


def _fits(service, operation: str, member: str, value: str) -> bool:
    meta = service.operation_model(operation).input_shape.members[member].metadata
    pattern = meta.get("pattern")
    return (meta.get("min", 0) <= len(value) <= meta["max"]
            and (pattern is None or regex.fullmatch(pattern, value) is not None))


run_names = st.from_regex(r"[a-zA-Z0-9](-{0,3}[a-zA-Z0-9]){0,47}", fullmatch=True).filter(
    lambda s: regex.fullmatch(_NAME, s) is not None)
prefixes = st.from_regex(r"[a-z][a-z0-9-]{0,%d}-" % (MAX_JOB_PREFIX - 2), fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(name=run_names, prefix=prefixes, when=st.floats(0, 4e9), segment=st.integers(1, MAX_SEGMENTS),
       spot=st.booleans())
def test_every_name_derived_from_an_accepted_run_name_fits_its_api(name, prefix, when, segment, spot):
    assert parse_run({**RUN, "name": name}).name == name
    execution = execution_name(name, when)
    assert _fits(_SFN, "StartExecution", "name", execution)
    check_execution_name(execution)  # it is also the jobs' `execution` tag
    first = job_name(prefix, name, execution)
    assert _fits(_SM, "CreateTrainingJob", "TrainingJobName", segment_job_name(first, segment, spot))
    key = "0123456789abcdef" * 4
    assert _fits(_SM, "CreateProcessingJob", "ProcessingJobName", preparation_job_name(prefix, key, execution))
    endpoint = resource_name(name)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(when))
    serving = f"{resource_name(endpoint, 63 - len(stamp) - 1)}-{stamp}"
    assert _fits(_SM, "CreateEndpoint", "EndpointName", endpoint)
    assert _fits(_SM, "CreateModel", "ModelName", serving)
    assert _fits(_SM, "CreateEndpointConfig", "EndpointConfigName", serving)


@pytest.mark.parametrize("name", ["a" * 49, "a" + "-" * 80 + "b", "a" + "-" * 47, "-a", "a_b", "a b", ""])
def test_a_run_name_over_48_characters_or_off_pattern_is_refused(name):
    with pytest.raises(RunValidationError) as err:
        parse_run({**RUN, "name": name})
    assert err.value.field == "name"


@pytest.mark.parametrize("key", ["datasets/../output/x", "datasets/%2e%2e/output/x", "datasets/%2E%2e/x",
                                 "models/../checkpoints/other-run/", "datasets//x", "datasets/./x",
                                 "datasets\\..\\output", "datasets/%2f..%2foutput", "/datasets/x"])
def test_an_s3_key_that_could_leave_its_prefix_is_refused_by_field(key):
    with pytest.raises(RunValidationError) as err:
        parse_run({**RUN, "data": {"source": f"s3://bucket-1/{key}", "seq_len": 128}})
    assert err.value.field == "data.source" and "plain segments" in str(err.value)


@settings(max_examples=300, deadline=None)
@given(segments=st.lists(st.sampled_from(["datasets", "..", ".", "", "%2e%2e", "a", "x%2F", "b.c", "..."]),
                         min_size=1, max_size=6))
def test_an_accepted_s3_source_names_exactly_the_prefix_it_spells(segments):
    """Whatever a run's data.source spells, if it is accepted its key has no segment a reader could resolve
    elsewhere: the key equals its own normalized form."""
    key = "/".join(segments)
    try:
        run = parse_run({**RUN, "data": {"source": f"s3://bucket-1/{key}", "seq_len": 128}})
    except RunValidationError:
        return
    accepted = run.data.source.split("/", 3)[3]
    assert ".." not in accepted.split("/") and "." not in accepted.split("/") and "%" not in accepted
    assert "//" not in accepted
