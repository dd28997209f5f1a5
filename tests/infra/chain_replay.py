"""The state machine's training loop replayed in Python, on the simulated SageMaker of tests/infra/sagemaker_sim.py:
for properties over many generated plans, where moto's interpreter (tests/infra/test_cap_holds.py) is too slow.

It does what the rendered loop does with the cost guard's answers (spotrun/pipeline/guard.py `decide`): wait the guard's
`wait_seconds`, stop the job on `stop`, create the next job from the guard on `segment`/`fallback`, and on
`continue` the same in a fresh execution (its history count restarted as a continued execution's). It is checked
against moto's run of the same scenario in tests/infra/test_cap_holds.py (same jobs, same bill).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace

from spotrun.pipeline.continuation import CONTINUED_EXECUTION_EVENTS
from spotrun.pipeline.guard import decide
from spotrun.seams import EXECUTION_TAG, FIRST_EXECUTION_EVENTS, Guard, GuardAction, Plan
from tests.infra.sagemaker_sim import SimJob, World, _ts

NEXT_JOB = (GuardAction.SEGMENT, GuardAction.FALLBACK, GuardAction.CONTINUE)


@dataclass
class Replayed:
    action: GuardAction
    message: str
    cost_usd: float  # what the simulated SageMaker billed, every job run out
    jobs: int
    executions: int
    history_events: list[int] = field(default_factory=list)  # the guard's count per execution, at its end


def _job(guard: Guard, plan: Plan) -> SimpleNamespace:
    config = plan.resource_config_spot if guard.spot else plan.resource_config_on_demand
    stopping = {"MaxRuntimeInSeconds": guard.max_runtime_seconds}
    if guard.spot:
        stopping["MaxWaitTimeInSeconds"] = guard.max_wait_seconds
    return SimpleNamespace(training_job_name=guard.job_name, enable_managed_spot_training=guard.spot,
                           resource_config=config, stopping_condition=stopping,
                           hyper_parameters=dict(guard.hyperparameters or {}), failure_reason=None)


def describe(sim: SimJob) -> dict:
    """DescribeTrainingJob's answer for the simulated job, as moto renders the same attributes."""
    job = sim.job
    out = {"TrainingJobName": job.training_job_name, "TrainingJobStatus": job.training_job_status,
           "SecondaryStatus": job.secondary_status, "SecondaryStatusTransitions": job.secondary_status_transitions,
           "StoppingCondition": job.stopping_condition, "ResourceConfig": job.resource_config,
           "CreationTime": _ts(sim.created), "TrainingStartTime": job.training_start_time,
           "FinalMetricDataList": job.final_metric_data_list,
           "ModelArtifacts": {"S3ModelArtifacts": f"s3://replay/{job.training_job_name}/model.tar.gz"}}
    if sim.ended:
        out.update(BillableTimeInSeconds=job.billable_time_in_seconds,
                   TrainingTimeInSeconds=job.training_time_in_seconds, TrainingEndTime=job.training_end_time)
        if job.failure_reason:
            out["FailureReason"] = job.failure_reason
    return out


def replay(plan_json: dict, world: World, start: float, *, max_polls: int = 200_000) -> Replayed:
    """Run the plan's chain to its end in the world; every job then runs out (every Lambda gone)."""
    plan = Plan.from_json(plan_json)
    guard = Guard(action=GuardAction.WAIT, job_name=plan.job_name, spot=plan.spot, wait_seconds=plan.poll_seconds,
                  spent_before_usd=plan.spent_before_usd, interruptions_before=0, segment=1,
                  max_runtime_seconds=plan.max_runtime_seconds, max_wait_seconds=plan.max_wait_seconds,
                  hyperparameters=plan.hyperparameters, history_events=FIRST_EXECUTION_EVENTS)
    now, jobs, counts = start, [], []
    jobs.append(SimJob(_job(guard, plan), world, now))
    for _ in range(max_polls):
        now += guard.wait_seconds
        for sim in jobs:
            sim.sync(now)
        step = int(world.committed_s / world.step_s) if world.committed_s and world.step_s else None
        guard = decide(plan, guard, describe(jobs[-1]), now=now, checkpoint_step=step,
                       job_tags={EXECUTION_TAG: plan.execution})
        if guard.action == GuardAction.WAIT:
            continue
        if guard.action == GuardAction.STOP:
            jobs[-1].stop()
            jobs[-1]._publish()
            continue
        if guard.action in NEXT_JOB:
            if guard.action == GuardAction.CONTINUE:
                counts.append(int(guard.history_events))
                guard = dataclasses.replace(guard, history_events=CONTINUED_EXECUTION_EVENTS)
            jobs.append(SimJob(_job(guard, plan), world, now))
            continue
        break
    counts.append(int(guard.history_events))
    for sim in jobs:
        sim.sync(now + 90 * 86400)
    return Replayed(action=guard.action, message=guard.message, cost_usd=sum(s.cost_usd() for s in jobs),
                    jobs=len(jobs), executions=len(counts), history_events=counts)
