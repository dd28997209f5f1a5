"""The acceptance check of the cost cap, black-box: the rendered state machine, run by moto's interpreter with the
real handlers deciding, against a SageMaker that bills as documented (tests/infra/sagemaker_sim.py).

Across caps from 1.3x the spot estimate to 1.5x the on-demand estimate, 1 and 16 instances, 0-5 interruptions,
MaxWait without spot capacity (on-demand fallback), warm pools, and injected failures (the guard raising from
some poll on, guard and canceller both raising, StopTrainingJob throttled), each run ends, the canceller does
what it does when the execution failed, then every job runs on until SageMaker itself ends it. Then:
- no run has cost more than its cap (what SageMaker billed, warm pools included);
- every run without an injected failure whose cap is at least 1.3x its estimate finishes and is registered;
- without a deadline the guard never switches spot and on-demand for the spot policy; with one, where spot
  capacity disappears (none at all, or 30 interruptions each waiting 30 min for capacity), the guard stops the
  spot job when progress falls behind the estimate's chosen policy and an on-demand job meets the deadline.

The clock is simulated (Wait states and retry intervals advance it), so a 10-hour run takes seconds.
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass, field
from unittest import mock

import pytest
from moto import mock_aws
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.core.exceptions import JsonRESTError
from moto.core.responses import ActionResult
from moto.sagemaker.models import SageMakerModelBackend
from moto.sagemaker.responses import SageMakerResponse
from moto.servicequotas.responses import ServiceQuotasResponse
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import WaitFunction

from spotrun.handlers import cancel as cancel_handler
from spotrun.handlers import cost_guard
from spotrun.pipeline import continuation
from spotrun.planner.estimate import load_catalog, startup_seconds
from tests.infra.chain_replay import replay
from tests.infra.sagemaker_sim import SimClock, Simulation, World
from tests.infra.test_state_machine_moto import BUCKET, REGION, Driver, _list_service_quotas, start_execution_as_aws

pytestmark = pytest.mark.slow

LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False}
# One node: 9.9 h on a g6e.48xlarge; sixteen: 7.2 h on p4d.24xlarge (the planner's figures).
SHAPES = {1: ({"instance_type": "auto"}, 200_000_000), 16: ({"instance_type": "ml.p4d.24xlarge",
                                                             "instance_count": 16}, 2_000_000_000)}
POLL_SECONDS, MAX_POLL_SECONDS = "900", "14400"  # the guard's schedule, on the simulated clock


@dataclass(frozen=True)
class Scenario:
    nodes: int = 1
    cap: tuple[str, float] = ("spot", 1.3)  # (estimate, factor)
    interruptions: int = 0
    spot: bool = True
    no_spot_capacity: bool = False
    warm_pool_minutes: int = 0
    guard_raises_from: int = 0  # the guard's poll from which every call raises (0: never)
    canceller_raises: bool = False
    stop_throttled: bool = False
    slowdown: float = 1.0  # the run really needs this many times the estimated training time
    deadline_hours: float | None = None  # compute.deadline_hours: the estimate chooses a deadline-aware policy
    continue_each_segment: bool = False  # every segment in a fresh execution (as if each history were full)

    @property
    def injected(self) -> bool:
        return bool(self.guard_raises_from or self.canceller_raises or self.stop_throttled or self.slowdown > 1)

    def __str__(self) -> str:
        parts = [f"{self.nodes}n", f"cap{self.cap[1]}x{self.cap[0]}", f"int{self.interruptions}"]
        parts += [name for name, on in (("od", not self.spot), ("nospot", self.no_spot_capacity),
                                        (f"pool{self.warm_pool_minutes}", self.warm_pool_minutes),
                                        (f"guard-dies@{self.guard_raises_from}", self.guard_raises_from),
                                        ("canceller-dies", self.canceller_raises),
                                        ("stop-throttled", self.stop_throttled),
                                        (f"slow{self.slowdown}", self.slowdown > 1),
                                        (f"deadline{self.deadline_hours}h", self.deadline_hours),
                                        ("fresh-executions", self.continue_each_segment)) if on]
        return "-".join(parts)


SCENARIOS = [
    # caps between 1.3x spot and 1.5x on-demand, one node, with and without interruptions
    *[Scenario(cap=cap, interruptions=n) for cap in (("spot", 1.3), ("mid", 1.0), ("on_demand", 1.0),
                                                      ("on_demand", 1.5)) for n in (0, 5)],
    Scenario(cap=("spot", 1.3), interruptions=2),
    # sixteen nodes
    Scenario(nodes=16, cap=("spot", 1.3), interruptions=3),
    Scenario(nodes=16, cap=("on_demand", 1.5), interruptions=0),
    # no spot capacity within MaxWait: the on-demand fallback, budget permitting
    Scenario(cap=("spot", 1.3), no_spot_capacity=True),
    Scenario(cap=("on_demand", 1.5), no_spot_capacity=True),
    # on-demand with a warm pool
    Scenario(spot=False, cap=("on_demand", 1.05), warm_pool_minutes=60),
    Scenario(spot=False, cap=("on_demand", 1.5), warm_pool_minutes=30),
    # injected failures; a run twice as slow as estimated (its spot bill alone would pass the cap)
    Scenario(cap=("spot", 1.3), slowdown=2.0),
    Scenario(cap=("spot", 1.3), slowdown=2.0, guard_raises_from=3, canceller_raises=True, stop_throttled=True),
    Scenario(cap=("mid", 1.0), guard_raises_from=4),
    Scenario(cap=("spot", 1.3), guard_raises_from=12, canceller_raises=True),
    Scenario(cap=("spot", 1.3), guard_raises_from=3, canceller_raises=True, stop_throttled=True),
    Scenario(nodes=16, cap=("on_demand", 1.5), guard_raises_from=3, canceller_raises=True, stop_throttled=True),
    Scenario(cap=("mid", 1.0), interruptions=1, guard_raises_from=10, stop_throttled=True),
    # issue #28: 16 nodes at 1.3x spot stopped at 88 of 96 steps with $120.72 left; every segment in a fresh
    # execution (the history's limit), with interruptions, and a run killed in its second execution
    Scenario(nodes=16, cap=("spot", 1.3), interruptions=1),
    Scenario(cap=("spot", 1.3), interruptions=2, continue_each_segment=True),
    Scenario(cap=("spot", 1.3), interruptions=1, continue_each_segment=True, guard_raises_from=16),
    # issue #28's promise at its edge: a cap of the P95 spot bill plus one restart, five interruptions
    Scenario(cap=("p95_and_restart", 1.0), interruptions=5),
]
# A deadline whose spot capacity disappears: none at all, or interruptions that each wait 30 min for capacity. The
# deadline is one the MaxWait fallback meets on fewer than 99% of the estimate's traces, so a deadline policy is
# chosen: at 14 h the availability model with short stretches in seconds has it meet the deadline on >= 99% and
# chooses it, and a run without spot capacity then waits out MaxWait (the < 1% the estimate allows).
DEADLINE_SCENARIOS = [Scenario(cap=("on_demand", 1.5), no_spot_capacity=True, deadline_hours=12),
                      Scenario(cap=("on_demand", 1.5), interruptions=30, deadline_hours=12)]


@dataclass
class Outcome:
    status: str
    registered: bool
    cost_usd: float
    cap_usd: float
    estimate: dict
    jobs: list[str] = field(default_factory=list)
    executions: int = 1
    # (events in moto's history, the guard's count) of every execution that continued the run in a fresh one
    history: list[tuple[int, int]] = field(default_factory=list)
    forged: str = ""  # how an execution started with a copied continuation input and a raised cap ended
    polls: int = 0
    switches: int = 0  # the guard's stops for the spot policy (switch_requested)
    ends: list[str] = field(default_factory=list)  # each job's capacity and how it ended, in order
    hours: float | None = None  # from the execution's start to the end of the job that completed the run


class SimDriver(Driver):
    """The moto Driver with the simulated SageMaker behind it and failures injected."""

    def __init__(self, synth, sim: Simulation, scenario: Scenario):
        super().__init__(synth)
        self.sim, self.scenario, self.guard_calls, self.switches = sim, scenario, 0, 0

    def invoke(self, backend, function_name, qualifier, body, headers, response_headers) -> bytes:
        payload = json.loads(body)
        if "guard" in payload:
            self.sim.sync()
            self.guard_calls += 1
            if self.scenario.guard_raises_from and self.guard_calls >= self.scenario.guard_raises_from:
                response_headers["x-amz-function-error"] = "Unhandled"
                return json.dumps({"errorType": "ThrottlingException",
                                   "errorMessage": "injected: DescribeTrainingJob throttled"}).encode()
        logical = function_name.rsplit(":", 1)[-1] if function_name.startswith("arn:") else function_name
        fn = self.functions[logical]
        module, _, attr = fn["handler"].rpartition(".")
        env = {**fn["env"], "AWS_REGION": REGION, "POLL_SECONDS": POLL_SECONDS, "MAX_POLL_SECONDS": MAX_POLL_SECONDS}
        import importlib

        with mock.patch.dict(os.environ, env):
            out = getattr(importlib.import_module(module), attr)(payload, None)
        if "guard" in payload and out.get("switch_requested") and not payload["guard"].get("switch_requested"):
            self.switches += 1
        return json.dumps(out).encode()


def _run(scenario: Scenario, synth) -> Outcome:
    clock = SimClock(time.time())
    world = World(work_s=0, usd_per_instance_hour=0, spot_discount=0, checkpoint_interval_s=1)
    sim = Simulation(clock, world)
    driver = SimDriver(synth, sim, scenario)
    original_create = SageMakerModelBackend.create_training_job

    def create(self, **kwargs):
        job = original_create(self, **kwargs)
        sim.created(job)
        return job

    def stop(self) -> ActionResult:
        sim.stop_calls += 1
        if scenario.stop_throttled:
            raise JsonRESTError("ThrottlingException", "Rate exceeded")
        sim.stop(self._get_param("TrainingJobName"))
        return ActionResult({})

    class SimTime:
        sleep = staticmethod(clock.advance)

    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}), \
            mock.patch.dict(os.environ, {"AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}), \
            mock.patch.object(LambdaSimpleBackend, "invoke", lambda backend, *a: driver.invoke(backend, *a)), \
            mock.patch.object(SageMakerModelBackend, "create_training_job", create), \
            mock.patch.object(SageMakerResponse, "stop_training_job", stop, create=True), \
            mock.patch.object(ServiceQuotasResponse, "list_service_quotas", _list_service_quotas, create=True), \
            mock.patch.object(WaitFunction, "_wait_interval", lambda self, env, wait_seconds: clock.advance(
                wait_seconds)), \
            mock.patch.object(retrier_decl, "time", SimTime), \
            mock.patch.object(cost_guard, "clock", clock), start_execution_as_aws(), \
            mock.patch.object(continuation, "SEGMENT_EVENTS_MAX",
                              continuation.HISTORY_QUOTA if scenario.continue_each_segment
                              else continuation.SEGMENT_EVENTS_MAX):
        driver.setup()
        run = _run_json(scenario)
        estimate = _estimate(driver, run)
        base = {"spot": estimate["cost_usd"]["spot"], "on_demand": estimate["cost_usd"]["on_demand"]}
        base["mid"] = (base["spot"] + base["on_demand"]) / 2
        base["p95_and_restart"] = _p95_and_restart(estimate)
        base["p95"] = _p95_and_restart(estimate, restarts=0)
        base["own_bill"] = _own_bill(estimate, scenario) if scenario.spot and not scenario.no_spot_capacity else 0.0
        run["budget"]["max_usd"] = round(base[scenario.cap[0]] * scenario.cap[1], 2)
        _world(world, estimate, scenario)
        arn = driver.start(f"sim-{abs(hash(str(scenario))) % 10**8}", run)
        chain = driver.chain(arn, timeout=240)
        desc = chain[-1]
        history = [(len(driver.history(d["executionArn"])), json.loads(d["output"])["history_events"])
                   for d in chain[:-1]]
        if desc["status"] != "SUCCEEDED" and not scenario.canceller_raises:
            event = {"detail": {"executionArn": desc["executionArn"], "stateMachineArn": driver.sm_arn,
                                "name": desc["name"], "status": desc["status"],
                                "startDate": int(desc["startDate"].timestamp() * 1000), "input": desc["input"]}}
            env = driver.functions[next(k for k in driver.functions if k.startswith("PipelineCancelFn"))]["env"]
            with mock.patch.dict(os.environ, {**env, "AWS_REGION": REGION}):
                try:
                    cancel_handler.handler(event, None)
                except Exception:  # noqa: BLE001 - a throttled stop: Lambda retries, then the on-failure queue
                    pass
        forged = _forge_a_continuation(driver, sim, chain) if len(chain) > 1 else ""
        done = [j.t for j in sim.jobs.values() if j.completed_run and j.ended]
        ends = [f"{'spot' if j.spot else 'on-demand'}:{j.end_secondary or 'running'}" for j in sim.jobs.values()]
        sim.run_out()
        output = json.loads(desc.get("output") or "{}")
        return Outcome(status=desc["status"], registered=bool(output.get("model_package_arn")),
                       cost_usd=sim.truth_usd(), cap_usd=run["budget"]["max_usd"], estimate=base,
                       jobs=list(sim.jobs), polls=driver.guard_calls, switches=driver.switches, ends=ends,
                       hours=(done[0] - chain[0]["startDate"].timestamp()) / 3600 if done else None,
                       executions=len(chain), history=history, forged=forged)


def _forge_a_continuation(driver: SimDriver, sim: Simulation, chain: list[dict]) -> str:
    """Start an execution with a continued execution's input, its cap raised, under a name its parent did not
    start: it must fail before it creates a job (spotrun/pipeline/continuation.py `carried`)."""
    forged = json.loads(chain[1]["input"])
    forged["continuation"]["plan"]["max_usd"] = 1e6
    jobs = len(sim.jobs)
    desc = driver.wait(driver.start("forged-s2", forged), timeout=60)
    assert len(sim.jobs) == jobs, "the forged execution created a job"
    return f"{desc['status']}:{desc.get('error')}"


def _p95_and_restart(est: dict, restarts: int = 1) -> float:
    """The chosen policy's P95 spot bill (at an unbinding cap) and `restarts` restarts at the spot bill."""
    policy = est["spot_policy"]
    p95 = next(r["p95_usd"] for r in policy["policies"] if r["label"] == policy["chosen"])
    return p95 + restarts * est["segment_overhead_seconds"] * est["usd_per_hour"] / 3600 * est["spot_fraction"]


def _own_bill(est: dict, scenario: Scenario) -> float:
    """What the scenario's interruptions cost the run as one job, the cap not binding (its plan replayed with the
    guard's rule in Python: tests/infra/chain_replay.py): whether the pattern is within the P95."""
    world = World(work_s=0, usd_per_instance_hour=0, spot_discount=0, checkpoint_interval_s=1)
    _world(world, est, scenario)
    return replay(copy.deepcopy(est["free_plan"]), world, 1_767_225_600.0).cost_usd


def _run_json(scenario: Scenario) -> dict:
    compute, tokens = SHAPES[scenario.nodes]
    compute = {**compute, "spot": scenario.spot, "on_demand_fallback": True}
    if scenario.spot:  # a spot-only setting (refused with spot false: an on-demand job has no MaxWait)
        compute["accepted_delay_hours"] = 2
    if scenario.deadline_hours:  # the deadline binds, not MaxWait: the run accepts a long wait for spot
        compute["deadline_hours"] = scenario.deadline_hours
        if scenario.spot:
            compute["accepted_delay_hours"] = scenario.deadline_hours
    if scenario.warm_pool_minutes:
        compute["warm_pool_minutes"] = scenario.warm_pool_minutes
    return {"version": 1, "name": "sim-run",
            "model": {"config": copy.deepcopy(LLAMA_8B), "init": "random"},
            "data": {"source": f"s3://{BUCKET}/datasets/tiny/", "tokens": tokens, "seq_len": 4096},
            "training": {"method": "full", "micro_batch": 1, "grad_accum": 8},
            "compute": compute, "budget": {"max_usd": 1e9}}


def _estimate(driver: Driver, run: dict) -> dict:
    """The estimate the pipeline makes of this run without a binding cap (what the caps are multiples of)."""
    from spotrun.pipeline.plan import PipelineSettings, plan

    env = driver.functions[next(k for k in driver.functions if k.startswith("PipelineEstimateFn"))]["env"]
    settings = PipelineSettings.from_env({**env, "AWS_REGION": REGION})
    run = {**run, "budget": {"max_usd": settings.max_usd_per_run}}  # the stage's largest cap
    p = plan(run, "estimate-only", settings)
    assert p["status"] == "ok", p
    return {**p["estimate"], "free_plan": p, "segment_overhead_seconds": p["segment_overhead_seconds"],
            "spot_fraction": p["spot_fraction"],
            "checkpoint_upload_seconds": p["checkpoint_upload_seconds"], "usd_per_hour": p["usd_per_hour"],
            "seconds_per_step": p["seconds_per_step"]}


def _world(world: World, est: dict, scenario: Scenario) -> None:
    catalog = load_catalog()
    family = est["instance_type"].split(".")[1]
    world.work_s = (est["wall_seconds"] - startup_seconds(catalog["defaults"])) * scenario.slowdown
    world.usd_per_instance_hour = est["usd_per_hour"] / est["instance_count"]
    world.spot_discount = catalog["families"][family]["spot_discount"]
    world.checkpoint_interval_s = est["checkpoint_interval_s"]
    world.save_s = est["checkpoint_upload_seconds"]
    # The real pace: the planned one without the expected interruptions' share (those are simulated).
    planned = est["wall_seconds"] - startup_seconds(catalog["defaults"])
    world.step_s = est["seconds_per_step"] * planned / (planned + est["expected_overhead_seconds"]) * scenario.slowdown
    world.no_spot_capacity = scenario.no_spot_capacity
    world.save_on_notice = est["checkpoint_policy"] == "save_on_notice"
    n = scenario.interruptions
    world.interruptions_at = [world.work_s * (i + 1) / (n + 1) for i in range(n)]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_no_run_costs_more_than_its_cap_and_runs_the_cap_can_carry_finish_registered(scenario, synth):
    out = _run(scenario, synth)
    print(scenario, out)  # with -s: what each run cost, in how many jobs and polls
    assert out.cost_usd <= out.cap_usd + 0.01, out
    # A run the cap carries: on spot, an accepted run (the estimate refuses a cap no expected chain fits, naming
    # the smallest that does) whose cap is >= its P95 spot bill plus one restart, under an interruption pattern
    # whose own bill (one job, the cap not binding) is within that P95 (issue #28); on-demand (or after a
    # fallback), 1.3x its on-demand estimate.
    if scenario.no_spot_capacity or not scenario.spot:
        carried = out.cap_usd >= 1.3 * out.estimate["on_demand"]
    else:
        carried = bool(out.jobs) and out.cap_usd >= out.estimate["p95_and_restart"] - 0.005 and \
            out.estimate["own_bill"] <= out.estimate["p95"]
    if not scenario.injected and carried:
        assert out.status == "SUCCEEDED" and out.registered, out
    assert out.switches == 0, out  # without a deadline the spot policy never switches
    if scenario.continue_each_segment:  # one segment per execution, the guard's count an upper bound of moto's
        assert out.executions == len(out.jobs), out
        assert all(moto <= counted for moto, counted in out.history), out
        assert out.forged == ("FAILED:InvalidRun" if out.executions > 1 else ""), out


@pytest.mark.parametrize("scenario", DEADLINE_SCENARIOS, ids=str)
def test_a_run_with_a_deadline_whose_spot_capacity_goes_switches_to_on_demand_and_meets_it_under_its_cap(
        scenario, synth):
    out = _run(scenario, synth)
    print(scenario, out)
    assert out.status == "SUCCEEDED" and out.registered, out
    assert out.switches >= 1 and out.cost_usd <= out.cap_usd + 0.01, out
    # The guard stopped the spot job (not MaxWait, not MaxRuntime) and an on-demand job finished the run.
    assert out.ends[0] == "spot:Stopped" and out.ends[-1] == "on-demand:Completed", out
    assert out.hours is not None and out.hours <= scenario.deadline_hours, out
