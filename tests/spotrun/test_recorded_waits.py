"""The recorder's waits for spot capacity: read from a finished spot job's status transitions, recorded once per
wait in DynamoDB (moto), and read back per instance type for the estimate."""

from __future__ import annotations

import copy
from datetime import datetime, timezone

import pytest
from moto import mock_aws

from spotrun.handlers import interruptions
from spotrun.planner.measured import record_waits, recorded_waits, wait_items
from spotrun.seams import RecorderEnvironment

from .pipeline_inputs import SETTINGS, recorder_table, tiny_run

T0 = 1_764_583_200_000  # epoch milliseconds, as EventBridge delivers SageMaker's timestamps
MIN = 60_000


def _event(status: str = "Completed", *, spot: bool = True, name: str = "spotrun-dev-a-1", t0: int = T0,
           transitions: list[tuple[str, int]] | None = None) -> dict:
    """A "SageMaker Training Job State Change" event as EventBridge delivers it: the envelope, and a detail of
    DescribeTrainingJob's shape (times in epoch milliseconds; each transition's StartTime, and EndTime but for the
    last). `transitions`: (status, minutes after t0). Default: created, 5 min Starting, trained 40 min, interrupted,
    waited 95 min (Interrupted, then Starting again), then Downloading and Training to the end."""
    steps = transitions or [("Starting", 0), ("Downloading", 5), ("Training", 6), ("Interrupted", 46),
                            ("Starting", 100), ("Downloading", 141), ("Training", 143), ("Uploading", 200),
                            (status, 202)]
    trans = []
    for i, (s, m) in enumerate(steps):
        t = {"Status": s, "StartTime": t0 + m * MIN, "StatusMessage": f"{s}."}
        if i + 1 < len(steps):
            t["EndTime"] = t0 + steps[i + 1][1] * MIN
        trans.append(t)
    detail = {"TrainingJobName": name,
              "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}",
              "TrainingJobStatus": status, "SecondaryStatus": steps[-1][0],
              "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
              "StoppingCondition": {"MaxRuntimeInSeconds": 86400, "MaxWaitTimeInSeconds": 172800},
              "CreationTime": t0, "TrainingStartTime": t0 + 5 * MIN, "LastModifiedTime": t0 + steps[-1][1] * MIN,
              "EnableManagedSpotTraining": spot, "SecondaryStatusTransitions": trans}
    return {"version": "0", "id": "844e2571-85d4-695f-b930-0153b71dcb42",
            "detail-type": "SageMaker Training Job State Change", "source": "aws.sagemaker",
            "account": "123456789012", "time": "2025-12-01T13:00:00Z", "region": "us-east-1",
            "resources": [detail["TrainingJobArn"]], "detail": detail}


def test_a_finished_spot_jobs_waits_run_from_an_interruption_or_its_creation_to_the_next_start_of_work():
    items = wait_items(_event()["detail"])
    assert [(i["after"], float(i["seconds"])) for i in items] == [("creation", 5 * 60), ("interruption", 95 * 60)]
    assert items[1]["sk"] == f"WAIT#{(T0 + 141 * MIN) / 1000:.0f}" and items[1]["instance_type"] == "ml.g5.xlarge"
    # straight to Training (no Downloading), and times as ISO strings: the same waits
    iso = _event(transitions=[("Starting", 0), ("Training", 3), ("Interrupted", 30), ("Starting", 31),
                              ("Training", 90), ("Interrupted", 120), ("Training", 150), ("Completed", 200)])
    for t in iso["detail"]["SecondaryStatusTransitions"]:
        t["StartTime"] = datetime.fromtimestamp(t["StartTime"] / 1000, timezone.utc).isoformat()
    iso["detail"]["CreationTime"] = datetime.fromtimestamp(T0 / 1000, timezone.utc).isoformat()
    assert [float(i["seconds"]) for i in wait_items(iso["detail"])] == [180, 60 * 60, 30 * 60]


def test_no_wait_is_read_from_an_on_demand_job_a_running_one_or_a_wait_the_job_ended_in():
    assert wait_items(_event(spot=False)["detail"]) == []  # on-demand: its Starting is no wait for spot capacity
    assert wait_items(_event("InProgress")["detail"]) == []  # recorded once, when the job has finished
    ended_waiting = _event("Stopped", transitions=[("Starting", 0), ("Training", 4), ("Interrupted", 60),
                                                   ("Starting", 61), ("MaxWaitTimeExceeded", 600)])
    assert [i["after"] for i in wait_items(ended_waiting["detail"])] == ["creation"]  # the last wait never ended
    # no EnableManagedSpotTraining in the detail: a job that was interrupted is a spot job
    no_flag = _event()
    del no_flag["detail"]["EnableManagedSpotTraining"]
    assert len(wait_items(no_flag["detail"])) == 2


def test_the_recorder_records_each_wait_once_and_the_estimate_reads_the_mean_after_interruptions(monkeypatch):
    with mock_aws():
        table = recorder_table()
        assert record_waits(_event(), table) == "recorded"
        assert record_waits(copy.deepcopy(_event()), table) == "duplicate"  # EventBridge delivered it again
        assert table.scan()["Count"] == 2
        assert recorded_waits(table) == {}  # one wait after an interruption: under the minimum evidence
        for k, wait_min in enumerate((30, 60, 120, 240)):
            ev = _event(name=f"spotrun-dev-b-{k}", transitions=[
                ("Starting", 0), ("Training", 2), ("Interrupted", 50), ("Starting", 50 + wait_min // 2),
                ("Training", 50 + wait_min), ("Completed", 300 + wait_min)])
            assert record_waits(ev, table) == "recorded"
        mean_s, count = recorded_waits(table)["ml.g5.xlarge"]
        assert count == 5 and mean_s == pytest.approx((95 + 30 + 60 + 120 + 240) * 60 / 5)
        assert recorded_waits(table, min_waits=6) == {}
        # the Lambda: an Interrupted event records the interruption, the finished job's event its waits
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for k, v in RecorderEnvironment(table_name="t", stage="dev").to_env().items():
            monkeypatch.setenv(k, v)
        done = _event("Stopped", name="spotrun-dev-c-1")
        assert interruptions.handler(done, None)["waits"] == "recorded"
        assert recorded_waits(table)["ml.g5.xlarge"][1] == 6


# ---- the estimate ------------------------------------------------------------------------------------------------

H = 3600.0
RUN = {"version": 1, "name": "w", "model": {"parameters": 1_000_000_000},
       "data": {"tokens": 2_000_000_000, "seq_len": 2048}, "budget": {"max_usd": 1_000_000},
       "compute": {"instance_type": "ml.g5.xlarge", "on_demand_fallback": True}}


def _run(**checkpoint):
    from spotrun.contract.spec import parse_run

    return parse_run({**RUN, "checkpoint": checkpoint} if checkpoint else RUN)


def test_the_estimate_plans_with_the_runs_mean_wait_else_the_recorded_one_else_the_models_and_says_which():
    from spotrun.planner.estimate import estimate

    recorded = {"ml.g5.xlarge": (5.1 * H, 12)}
    plain = estimate(_run())
    assert plain.mean_wait_seconds is None and "mean_wait_seconds" not in plain.to_json()
    assert estimate(_run(), recorded_waits={"ml.p4d.24xlarge": (H, 9)}).mean_wait_seconds is None  # another type
    est = estimate(_run(), recorded_waits=recorded)
    assert est.mean_wait_seconds == 5.1 * H
    assert est.mean_wait_source == "recorded: 12 waits for capacity on ml.g5.xlarge"
    assert est.to_json()["mean_wait_seconds"] == 5.1 * H
    given = estimate(_run(mean_wait_hours=0.5), recorded_waits=recorded)  # the run's own wins
    assert given.mean_wait_seconds == 0.5 * H and given.mean_wait_source == "checkpoint.mean_wait_hours=0.5"
    on_demand = estimate(parse_on_demand(), recorded_waits=recorded)
    assert on_demand.mean_wait_seconds is None  # no spot capacity waited for
    # everything else the planner figures is the same: the wait only shapes the policy's traces
    assert {**est.to_json(), "mean_wait_seconds": None, "mean_wait_source": None} == \
        {**plain.to_json(), "mean_wait_seconds": None, "mean_wait_source": None}


def parse_on_demand():
    from spotrun.contract.spec import parse_run

    return parse_run({**RUN, "compute": {**RUN["compute"], "spot": False, "on_demand_fallback": False}})


def test_a_long_recorded_wait_lowers_the_odds_of_a_policy_that_waits_for_spot_and_the_source_says_so():
    from spotrun.contract.spec import RunValidationError, parse_run
    from spotrun.planner.estimate import estimate, load_catalog
    from spotrun.policy.choose import spot_policy

    plain = estimate(_run())
    deadline = {**RUN, "compute": {**RUN["compute"], "deadline_hours": round(plain.wall_seconds / H * 1.5, 1)}}
    run = parse_run(deadline)
    rows = {}
    for name, waits in (("model", None), ("short", {"ml.g5.xlarge": (0.05 * H, 20)}),
                        ("long", {"ml.g5.xlarge": (20 * H, 20)})):
        est = estimate(run, recorded_waits=waits)
        section = spot_policy(run, est, load_catalog(), n=200).section
        rows[name] = {r["label"]: r for r in section.policies}
        if waits:
            assert f"({est.mean_wait_source})" in section.trace_source
            assert f"waits for capacity of {est.mean_wait_seconds / H:.2g} h on average" in section.trace_source
    maxwait = "maxwait_fallback (notice)"
    assert rows["long"][maxwait]["p_deadline"] < rows["model"][maxwait]["p_deadline"] <= \
        rows["short"][maxwait]["p_deadline"]
    for bad in (0, -1, 169, "5"):
        with pytest.raises(RunValidationError, match="checkpoint.mean_wait_hours"):
            parse_run({**RUN, "checkpoint": {"mean_wait_hours": bad}})


def test_the_estimate_step_passes_the_recorded_waits_to_the_plans_spot_policy():
    from spotrun.pipeline.plan import plan

    settings, run = SETTINGS, tiny_run()
    plain = plan(copy.deepcopy(run), "exec-1", settings)
    waited = plan(copy.deepcopy(run), "exec-1", settings, waits={"ml.g5.xlarge": (7.5 * H, 30)})
    source = waited["estimate"]["spot_policy"]["trace_source"]
    assert "waits for capacity of 7.5 h on average (recorded: 30 waits for capacity on ml.g5.xlarge)" in source
    assert "recorded" not in plain["estimate"]["spot_policy"]["trace_source"]
