"""Replay one trace window through the rendered state machine with the real handlers, and predict it.

`replay_windows` runs each (policy, trace) window as an execution of the synthesized state machine in moto's
interpreter (the estimate, cost guard and canceller handlers deciding; tests/infra/test_cap_holds.py's driver)
against a SageMaker whose spot capacity is the trace (tests/infra/trace_sim.py), and predicts the same window with
the estimate's simulator (spotrun/policy/execution.py: `execute`) from the plan's own policy section. The
estimate's policy section is computed once (its simulation of 1,000 traces is not what is replayed) and its
`policy` set to the window's. Used by tests/infra/test_replay.py and benchmarks/replay_bench.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import time
from dataclasses import dataclass
from unittest import mock

from moto import mock_aws
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.core.exceptions import JsonRESTError
from moto.core.responses import ActionResult
from moto.s3 import models as s3_models
from moto.sagemaker.models import SageMakerModelBackend
from moto.sagemaker.responses import SageMakerResponse
from moto.servicequotas.responses import ServiceQuotasResponse
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import WaitFunction
from moto.stepfunctions.parser.models import stepfunctions_parser_backends

from spotrun.handlers import cost_guard
from spotrun.pipeline.plan import PipelineSettings, plan
from spotrun.planner.segments import JOB_END_S
from spotrun.policy import choose
from spotrun.policy.decision import poll_wait
from spotrun.policy.engine import SimPlan
from spotrun.policy.execution import execute
from spotrun.policy.policies import cost_usd
from spotrun.seams import SpotPolicy
from tests.infra.sagemaker_sim import SimClock, World, s3_clock
from tests.infra.test_cap_holds import Scenario, SimDriver, _run_json
from tests.infra.test_state_machine_moto import ACCOUNT, REGION, _list_service_quotas
from tests.infra.trace_sim import SentinelJob, TraceSimulation, Trainer


@dataclass
class Window:
    policy: str
    trace: list  # capacity windows (s) from the first job's creation
    label: str = ""
    number: int | None = None  # its place among the windows drawn (benchmarks/replay_bench.py)


@dataclass
class Agreement:
    window: Window
    status: str
    replay_hours: float | None  # the execution's start to the end of the job that completed the run
    predicted_hours: float | None
    replay_usd: float  # what the simulated SageMaker billed
    predicted_usd: float
    poll_hours: float  # the guard's poll interval at the predicted finish (the tolerance on time)
    jobs: int  # training jobs (not sentinels)
    predicted_jobs: int
    deadline_hours: float
    sentinels: int = 0  # the cost guard's sentinel jobs (tests/infra/trace_sim.py SentinelJob)
    predicted_sentinels: int = 0
    cap_usd: float = 0.0  # the run's budget.max_usd
    ends: tuple = ()  # each job's name and how it ended, in creation order
    error: str = ""  # the execution's error when it failed (OverBudget: the guard ended the run at the cap)
    cause: str = ""  # and its cause (the guard's message)

    @property
    def agrees(self) -> bool:
        """Both sides finished (the execution succeeded) or neither did; finish within one poll; cost within 1%."""
        finished = self.status == "SUCCEEDED" or (self.replay_hours is None and self.predicted_hours is None)
        return finished and self.time_ok and self.cost_ok

    @property
    def finish_gap_hours(self) -> float | None:
        if self.replay_hours is None or self.predicted_hours is None:
            return None
        return abs(self.replay_hours - self.predicted_hours)

    @property
    def time_ok(self) -> bool:
        if self.replay_hours is None or self.predicted_hours is None:
            return self.replay_hours == self.predicted_hours
        return abs(self.replay_hours - self.predicted_hours) <= self.poll_hours + 1e-6

    @property
    def cost_ok(self) -> bool:
        return abs(self.replay_usd - self.predicted_usd) <= 0.01 * self.predicted_usd + 0.01


class ReplayDriver(SimDriver):
    """test_cap_holds' driver; Step Functions' $$.Execution.StartTime (the estimate's `started`) on the
    simulated clock, as every other time the handlers read."""

    gone_after_sentinel = False  # every Lambda and every stop fails once the guard has named a sentinel
    gone = False

    def invoke(self, backend, function_name, qualifier, body, headers, response_headers) -> bytes:
        payload = json.loads(body)
        if "started" in payload:
            payload["started"] = dt.datetime.fromtimestamp(self.sim.clock(), dt.timezone.utc).isoformat()
            body = json.dumps(payload)
        if self.gone:
            response_headers["x-amz-function-error"] = "Unhandled"
            return json.dumps({"errorType": "ServiceException", "errorMessage": "injected: every Lambda is down"
                               }).encode()
        out = super().invoke(backend, function_name, qualifier, body, headers, response_headers)
        if self.gone_after_sentinel and "guard" in payload and json.loads(out).get("sentinel_name"):
            self.gone = True
        return out

    def wait(self, arn: str, timeout: float = 600) -> dict:
        """Driver.wait, reading the execution's status from moto's backend: a DescribeExecution through botocore
        every 0.2 s took ~40% of a window's CPU from the interpreter's thread."""
        executions = stepfunctions_parser_backends[ACCOUNT][REGION]
        deadline = time.monotonic() + timeout
        while executions.describe_execution(arn).status == "RUNNING":
            if time.monotonic() > deadline:
                raise TimeoutError(arn)
            time.sleep(0.05)
        return self.sfn.describe_execution(executionArn=arn)

    def as_lambda(self, *args) -> bytes:
        """moto's LambdaSimpleBackend.invoke (function name, qualifier, body, headers, response headers),
        replaced as a bound method: the real handler runs."""
        return self.invoke(None, *args)


class _Section:
    """The estimate's policy section, simulated once per cap and chain (the run's cap and the estimate's segments:
    what the section's `sim_plan` and left-out rows depend on), with the window's policy."""

    def __init__(self) -> None:
        self.choices: dict = {}
        self.policy = "uniform_progress"
        self.real = choose.spot_policy

    def __call__(self, run, est, catalog, **kw) -> choose.PolicyChoice:
        key = (run.max_usd, repr(est.segments), kw.get("poll_s"), kw.get("max_poll_s"))
        if key not in self.choices:
            self.choices[key] = self.real(run, est, catalog, **{**kw, "n": 100})
        choice = self.choices[key]
        sec = choice.section
        chosen = f"{self.policy} ({sec.checkpointing})"
        rows = sec.policies
        if not any(r["label"] == chosen for r in rows):  # a rule the estimate did not simulate: its row is a
            rows = [*rows, {**rows[0], "label": chosen}]  # stand-in (the replay compares with `execute`, not it)
        return dataclasses.replace(choice, section=dataclasses.replace(
            sec, policy=self.policy, chosen=chosen, policies=rows))


def replay_windows(synth, windows: list[Window], *, deadline_hours: float = 14.0,
                   gone_after_sentinel: bool = False, cap_x: float | None = None,
                   cap_usd: float | None = None) -> list[Agreement]:
    """`gone_after_sentinel`: from the poll whose guard created a sentinel, every Lambda and every StopTrainingJob
    fails and the jobs run until SageMaker ends them (their limits alone hold the cap). `cap_x`: the run's
    budget.max_usd is this many times the cap to set the estimate names (at the stage's largest cap), a cap that
    can bind; None: three times the on-demand estimate, one that never binds. `cap_usd`: the run's budget.max_usd
    itself (instead of `cap_x`)."""
    clock = SimClock(time.time())
    section = _Section()
    holder: dict = {}
    scenario = Scenario(cap=("on_demand", 3.0), deadline_hours=deadline_hours)
    original_create = SageMakerModelBackend.create_training_job

    def create(self, **kwargs):
        job = original_create(self, **kwargs)
        holder["sim"].created(job)
        return job

    def stop(self) -> ActionResult:
        if holder["driver"].gone:
            raise JsonRESTError("ThrottlingException", "injected: every stop fails")
        holder["sim"].stop(self._get_param("TrainingJobName"))
        return ActionResult({})

    class SimTime:
        sleep = staticmethod(clock.advance)

    out = []
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}), \
            mock.patch.dict(os.environ, {"AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}), \
            mock.patch.object(SageMakerModelBackend, "create_training_job", create), \
            mock.patch.object(SageMakerResponse, "stop_training_job", stop, create=True), \
            mock.patch.object(ServiceQuotasResponse, "list_service_quotas", _list_service_quotas, create=True), \
            mock.patch.object(WaitFunction, "_wait_interval",
                              lambda self, env, wait_seconds: clock.advance(wait_seconds)), \
            mock.patch.object(retrier_decl, "time", SimTime), \
            mock.patch.object(s3_models, "utcnow", s3_clock(clock)), \
            mock.patch.object(choose, "spot_policy", section), \
            mock.patch.object(cost_guard, "clock", clock):
        driver = None
        for k, window in enumerate(windows):
            world = World(work_s=0, usd_per_instance_hour=0, spot_discount=0, checkpoint_interval_s=1)
            holder["sim"] = sim = TraceSimulation(clock, world, None, window.trace)
            if driver is None:
                holder["driver"] = driver = ReplayDriver(synth, sim, scenario)
                driver.setup()
            driver.sim, driver.gone, driver.gone_after_sentinel = sim, False, gone_after_sentinel
            section.policy = window.policy
            with mock.patch.object(LambdaSimpleBackend, "invoke", driver.as_lambda):
                out.append(_one(driver, sim, world, window, scenario, f"w{k}-{time.time_ns() % 10**8}", cap_x,
                                cap_usd))
    return out


def _one(driver, sim, world: World, window: Window, scenario: Scenario, name: str,
         cap_x: float | None = None, cap_usd: float | None = None) -> Agreement:
    run = _run_json(scenario)
    est, plan_json = _plan_of(driver, run, None)  # at the stage's largest cap: the caps are multiples of its
    if cap_usd is not None:
        run["budget"]["max_usd"] = cap_usd
    elif cap_x is None:
        run["budget"]["max_usd"] = round(3.0 * est["cost_usd"]["on_demand"], 2)  # a cap that never binds
    else:  # the cap to set the estimate names, times cap_x
        named = est["spot_policy"]["deadline_cap_usd"] or est["spot_policy"]["p95_finish_cap_usd"]
        run["budget"]["max_usd"] = round(cap_x * named, 2)
    est, plan_json = _plan_of(driver, run, run["budget"]["max_usd"])  # the plan the state machine's estimate makes
    sp = SpotPolicy.from_json(est["spot_policy"])
    assert sp.policy == window.policy, (sp.policy, window.policy)
    plan = SimPlan(**sp.sim_plan)
    _configure(sim, world, plan, sp, plan_json)
    started = sim.clock()
    arn = driver.start(name, run)
    desc = driver.wait(arn, timeout=600)
    done = [j.t for j in sim.jobs.values() if j.completed_run and j.ended]
    replay_h = (done[0] - started) / 3600 if done else None
    predicted = execute(plan, window.trace, window.policy, sp.checkpointing)
    tally = predicted.tally
    pred_h = tally.t / 3600 if tally.finished else None
    finishing = predicted.jobs[-1]
    poll = poll_wait(tally.t - finishing.created, float("inf"), poll_s=plan.poll_s, max_poll_s=plan.max_poll_s)
    sim.run_out(90 * 86400 if driver.gone else 0)
    return Agreement(window=window, status=desc["status"], replay_hours=replay_h, predicted_hours=pred_h,
                     replay_usd=sim.truth_usd(), predicted_usd=sum(cost_usd(plan, tally)), poll_hours=poll / 3600,
                     jobs=sum(not isinstance(j, SentinelJob) for j in sim.jobs.values()),
                     predicted_jobs=len(predicted.jobs), deadline_hours=plan.deadline_s / 3600,
                     sentinels=sum(isinstance(j, SentinelJob) for j in sim.jobs.values()),
                     predicted_sentinels=predicted.sentinels, cap_usd=run["budget"]["max_usd"],
                     ends=tuple((j.job.training_job_name, j.end_secondary) for j in sim.jobs.values()),
                     error=desc.get("error") or "", cause=desc.get("cause") or "")


def _plan_of(driver, run: dict, cap_usd: float | None) -> tuple[dict, dict]:
    """The estimate the pipeline makes of this run (the stage's settings, as the Lambda has them) at `cap_usd`
    (None: the stage's largest cap)."""
    env = driver.functions[next(k for k in driver.functions if k.startswith("PipelineEstimateFn"))]["env"]
    settings = PipelineSettings.from_env({**env, "AWS_REGION": "us-east-1", "POLL_SECONDS": "900",
                                          "MAX_POLL_SECONDS": "14400"})
    p = plan({**run, "budget": {"max_usd": settings.max_usd_per_run if cap_usd is None else cap_usd}},
             "estimate-only", settings)
    assert p["status"] == "ok", p
    return p["estimate"], p


def _configure(sim: TraceSimulation, world: World, plan: SimPlan, section: SpotPolicy, plan_json: dict) -> None:
    """The simulated SageMaker and trainer run by the plan's own figures (the sim_plan the estimate promised). A
    sim_plan without the cap modelled (`SimPlan.cap_usd` None) runs a chain as one job whose work holds the chain's
    restarts (spotrun/policy/choose.py `plan_from_estimate`): the trainer trains the run's work without them, and
    the chain's jobs restart for real. With the cap modelled, the work is the run's."""
    seg = plan_json["estimate"]["segments"]
    chain_s = 0.0 if plan.cap_usd is not None else \
        max(0, int(seg["segments"] or 1) - 1) * float(seg["overhead_seconds"] or 0.0)
    world.work_s = plan.work_s - chain_s
    world.usd_per_instance_hour = plan.on_demand_usd_per_h / plan_json["instance_count"]
    world.spot_discount = 1 - plan.spot_usd_per_h / plan.on_demand_usd_per_h
    # the guard reads progress as step / planned steps; the simulator counts its commits in the same steps
    assert plan.steps == plan_json["planned_steps"], (plan.steps, plan_json["planned_steps"])
    world.step_s = world.work_s / plan_json["planned_steps"]
    ck = section.checkpointing
    sim.trainer = Trainer(startup_s=plan.startup_s, restore_s=plan.restore_s, save_s=plan.save_s,
                          interval_s=plan.interval_s if ck in ("periodic", "both") else float("inf"),
                          step_s=plan.step_s, notice=plan.notice_ok and ck in ("notice", "both"),
                          end_s=JOB_END_S if plan.cap_usd is not None else 0.0)


def windows_json(agreements: list[Agreement]) -> str:
    return json.dumps([{**a.__dict__, "window": a.window.label or a.window.policy} for a in agreements], indent=1)
