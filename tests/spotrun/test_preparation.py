"""The preparation step's rules (spotrun/pipeline/preparation.py) on S3 listings in moto: what the content key covers,
the tokenizer files the job downloads, the MaxRuntime the cap allows, and the merge refusing parts that disagree."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from spotrun.pipeline.plan import plan
from spotrun.pipeline.preparation import (
    PreparationRefused,
    content_key,
    max_runtime,
    processing_rate,
    raw_objects,
    tokenizer_objects,
    volume_gb,
)
from spotrun.pipeline.preparation_finish import merge_parts
from spotrun.planner.estimate import load_catalog
from spotrun.seams import PipelineSettings, PreparationSettings

BUCKET = "art"


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        for key, body in (("datasets/raw/a.jsonl", b'{"text": "a"}\n'), ("datasets/raw/sub/b.parquet", b"PAR1"),
                          ("datasets/raw/README.md", b"notes"), ("models/m/config.json", b"{}"),
                          ("models/m/tokenizer.json", b"{}"), ("models/m/chat_template.jinja", b"{{ m }}"),
                          ("models/m/model.safetensors", b"weights"),
                          ("models/m/model.safetensors.index.json", b"{}")):
            client.put_object(Bucket=BUCKET, Key=key, Body=body)
        yield client


def _key(s3, **options) -> str:
    opts = {"text_field": "text", "shard_bytes": 1 << 20, "validation_fraction": 0.0, **options}
    return content_key(raw_objects(s3, f"s3://{BUCKET}/datasets/raw/"),
                       tokenizer_objects(s3, f"s3://{BUCKET}/models/m/"), **opts)


def test_the_raw_inputs_are_the_supported_files_and_the_tokenizer_is_everything_but_the_weights(s3):
    assert [o["key"] for o in raw_objects(s3, f"s3://{BUCKET}/datasets/raw")] == ["a.jsonl", "sub/b.parquet"]
    assert [o["key"] for o in tokenizer_objects(s3, f"s3://{BUCKET}/models/m/")] == [
        "chat_template.jinja", "config.json", "tokenizer.json"]


def test_the_content_key_changes_with_an_input_a_tokenizer_file_or_an_option_and_nothing_else(s3):
    before = _key(s3)
    assert _key(s3) == before
    s3.put_object(Bucket=BUCKET, Key="datasets/raw/README.md", Body=b"other notes")  # not an input
    assert _key(s3) == before
    s3.put_object(Bucket=BUCKET, Key="models/m/model.safetensors", Body=b"other weights")  # not the tokenizer
    assert _key(s3) == before
    assert _key(s3, validation_fraction=0.1) != before
    s3.put_object(Bucket=BUCKET, Key="models/m/chat_template.jinja", Body=b"{{ other }}")  # an edited template
    edited = _key(s3)
    assert edited != before
    s3.put_object(Bucket=BUCKET, Key="datasets/raw/a.jsonl", Body=b'{"text": "b"}\n')
    assert _key(s3) not in (before, edited)


def test_a_model_directory_without_a_tokenizer_is_refused_by_field(s3):
    with pytest.raises(PreparationRefused) as refused:
        tokenizer_objects(s3, f"s3://{BUCKET}/datasets/raw/")
    assert refused.value.field == "model.source" and "tokenizer.json" in str(refused.value)


def test_the_jobs_maxruntime_is_what_the_cap_buys_at_the_processing_rate_and_a_tiny_cap_is_refused():
    rate = processing_rate(load_catalog(), "us-east-1", "ml.m5.xlarge") * 2
    assert rate == pytest.approx(0.46)
    settings = PreparationSettings()
    assert max_runtime(settings, 1.0, rate) == int(1.0 / (0.46 / 3600) - 120)  # 7,706 s: below the stage's 24 h
    assert max_runtime(settings, 1000.0, rate) == 24 * 3600
    with pytest.raises(PreparationRefused) as refused:
        max_runtime(settings, 0.05, rate)
    assert refused.value.over_budget and refused.value.field == "budget.max_usd"
    with pytest.raises(PreparationRefused, match="no processing price"):
        processing_rate(load_catalog(), "us-east-1", "ml.g5.xlarge")


def test_merging_refuses_parts_from_different_tokenizers_and_names_every_shard_from_the_root():
    part = {"format": 1, "dtype": "uint16", "eos_token_id": 0, "vocab_size": 300, "loss_mask": True,
            "total_tokens": 10, "shards": [{"file": "shard-00000.bin", "tokens": 10, "mask": "shard-00000.mask",
                                            "starts": "shard-00000.starts"}]}
    merged, validation = merge_parts({"algo-2": part, "algo-1": {**part, "loss_mask": False, "shards": [
        {"file": "shard-00000.bin", "tokens": 10}]}})
    assert [s["file"] for s in merged["shards"]] == ["parts/algo-1/shard-00000.bin", "parts/algo-2/shard-00000.bin"]
    assert merged["shards"][1]["mask"] == "parts/algo-2/shard-00000.mask" and merged["loss_mask"] is True
    assert merged["shards"][1]["starts"] == "parts/algo-2/shard-00000.starts"
    assert merged["total_tokens"] == 20 and validation is None
    with pytest.raises(ValueError, match="dtype='uint32' differs"):
        merge_parts({"algo-1": part, "algo-2": {**part, "dtype": "uint32"}})
    with pytest.raises(ValueError, match="produced nothing"):
        merge_parts({})


def test_each_instances_volume_holds_its_share_of_the_raw_files_and_its_part():
    settings = PreparationSettings()
    assert volume_gb(settings, 10 * 10**9, 2) == 100  # 5 GB each: the stage's 100 GB
    assert volume_gb(settings, 400 * 10**9, 2) == 610  # 200 GB each, x3 (+10): the text, its ids and masks
    assert volume_gb(settings, 10**16, 1) == 16384  # CreateProcessingJob's largest volume


def test_reading_raw_text_as_prepared_shards_says_the_pipeline_prepares_it(s3):
    from spotrun.contract.spec import RunValidationError, parse_run
    from spotrun.planner.sources import read_sources

    run = parse_run({"version": 1, "name": "r", "model": {"source": f"s3://{BUCKET}/models/m/"},
                     "data": {"source": f"s3://{BUCKET}/datasets/raw/", "seq_len": 64}, "budget": {"max_usd": 5}})
    with pytest.raises(RunValidationError) as refused:
        read_sources(run, s3_client=s3)
    assert refused.value.field == "data.source" and "prepared by the pipeline itself" in str(refused.value)


def test_the_poll_loop_takes_at_most_300_turns_of_the_executions_history_whatever_the_maxruntime():
    from spotrun.pipeline.preparation import MAX_PREPARATION_POLLS, preparation_poll_seconds

    assert preparation_poll_seconds(3600, 60, 4 * 3600) == 60  # a short job: the stage's poll
    for runtime in (24 * 3600, 777_600):  # the default and CreateProcessingJob's longest MaxRuntime
        assert runtime / preparation_poll_seconds(runtime, 60, 4 * 3600) <= MAX_PREPARATION_POLLS == 300
    assert preparation_poll_seconds(777_600, 60, 600) == 600  # never past the stage's longest poll


def test_a_run_the_checks_before_creating_refuse_gets_no_preparation_job(s3):
    """The estimate step's checks before anything is created (spotrun/pipeline/preflight.py) run before it answers
    Prepare too: raw data.source is planned a job only for a run they admit, so no job bills for a run refused
    after it."""
    s3.put_object(Bucket=BUCKET, Key="models/m/config.json",
                  Body=b'{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4}')
    settings = PipelineSettings(bucket=BUCKET, job_prefix="spotrun-dev-", model_package_group="g")
    run = {"version": 1, "name": "raw-run", "model": {"source": f"s3://{BUCKET}/models/m/"},
           "data": {"source": f"s3://{BUCKET}/datasets/raw/", "seq_len": 128},
           "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 50}}
    admitted = plan(run, "exec-1", settings, s3_client=s3, preparation=PreparationSettings())
    assert admitted["status"] == "Prepare" and admitted["field"] == "data.source"
    approved = {**run, "registry": {"approval_status": "Approved"}}
    refused = plan(approved, "exec-1", settings, s3_client=s3, preparation=PreparationSettings())
    assert (refused["status"], refused["field"]) == ("InvalidRun", "registry.approval_status")
