"""A segment's end (spotrun/planner/segments.py): with `segment_seconds` the trainer saves and exits cleanly, without
completing, and the next job on the same checkpoints finishes the same run; the completion line is what the
pipeline's completion metric reads."""

from __future__ import annotations

import json
import re

from spotrun.seams import COMPLETED_METRIC_DEFINITION
from tests.trainer.conftest import assert_same_run


def test_a_segment_ends_with_a_save_and_the_next_job_finishes_the_same_run(job_factory, baseline):
    job = job_factory("segments", segment_seconds="0.001")  # the time is up after the first step
    assert job.run() == 0, job.text()[-3000:]
    text = job.text()
    assert "reason=segment-end" in text and "run_completed" not in text and not job.failure.exists()
    assert re.search(COMPLETED_METRIC_DEFINITION["Regex"], text) is None  # the pipeline sees no completion
    # The next segment, without a limit (SageMaker's next job: the same checkpoints, new hyperparameters).
    config = job.root / "sm" / "input" / "config" / "hyperparameters.json"
    hyper = json.loads(config.read_text())
    del hyper["segment_seconds"]
    config.write_text(json.dumps(hyper))
    assert job.run() == 0, job.text()[-3000:]
    assert "start_step=0" not in job.text().split("reason=segment-end")[-1]  # resumed, not restarted
    assert_same_run(job, baseline)
    final = re.search(COMPLETED_METRIC_DEFINITION["Regex"], job.text())
    assert final and int(final.group(1)) == 24  # the completion metric SageMaker extracts from the log
