"""The report's sample generations: the text shows each prompt with the base and the fine-tuned continuation, and
the registry's metadata points at the artifact's samples file within AWS's limits."""

from __future__ import annotations

import botocore.session
import regex

from spotrun.pipeline.guard import registry_metadata
from spotrun.pipeline.report import summary_text
from spotrun.seams import SAMPLES_FILE

SAMPLES = {"format": 1, "prompt_tokens": 4, "new_tokens": 3, "base": "model.path",
           "samples": [{"prompt_ids": [1, 2, 3, 4], "prompt": "the cat", "base_ids": [5, 5, 5], "base": "zz zz",
                        "tuned_ids": [6, 7, 8], "tuned": " sat down"},
                       {"prompt_ids": [9, 9, 9, 9], "prompt": None, "base_ids": [1, 1, 1], "base": None,
                        "tuned_ids": [2, 3, 4], "tuned": None}]}
REPORT = {"run": "r", "job_name": "j", "status": "Completed", "billable_seconds": 1.0, "training_seconds": 2.0,
          "spot_savings_pct": 50.0, "cost_usd": 0.1, "cap_usd": 5, "estimated_cost_usd": {"spot": 1, "on_demand": 2},
          "final_loss": 2.0, "base_val_loss": 3.0, "exported_val_loss": 2.5, "samples_file": SAMPLES_FILE}


def test_the_summary_shows_each_prompt_base_and_fine_tuned_text_or_ids_without_a_tokenizer():
    text = summary_text({**REPORT, "samples": SAMPLES})
    assert "greedy, 3 new tokens after each validation sample's first 4 (base: the base model)" in text
    assert "1. prompt     'the cat'\n       base       'zz zz'\n       fine-tuned ' sat down'" in text
    assert "2. prompt     [9, 9, 9, 9]\n       base       [1, 1, 1]\n       fine-tuned [2, 3, 4]" in text
    # The AWS report has only the pointer: the file inside the model artifact.
    assert "samples          samples.json in the model artifact" in summary_text(REPORT)


def test_the_registry_metadata_points_at_the_samples_within_create_model_package_limits():
    shape = botocore.session.get_session().get_service_model("sagemaker").shape_for("CustomerMetadataMap")
    key_max, value_max = shape.key.metadata["max"], shape.value.metadata["max"]
    pattern = shape.value.metadata["pattern"]
    meta = registry_metadata({**REPORT, "data_source": "s3://b/d", "segments": 1})
    assert meta["samples_file"] == SAMPLES_FILE
    for key, value in meta.items():
        assert len(key) <= key_max and 1 <= len(value) <= value_max
        assert regex.fullmatch(pattern, key) and regex.fullmatch(pattern, value), (key, value)
    assert "samples_file" not in registry_metadata({**REPORT, "samples_file": None, "data_source": "s3://b/d"})

