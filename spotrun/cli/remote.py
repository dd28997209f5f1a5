"""`spotrun start|status|logs|report|cancel|list`: a deployed stage's runs from the shell.

Each command finds the stage's state machine in its CloudFormation stack's outputs (stacks/spotrun_stack.py:
StateMachineArn, ArtifactBucket, ModelPackageGroupName); nothing is copied by hand. A run is an execution of
that state machine named `<run name>-<UTC time>`; RUN on the command line is a run name (its newest execution),
an execution name or an execution ARN. What the pipeline decided is read back from the execution's history: the
Estimate state's plan and the CostGuard's latest decision; the training job from SageMaker; the trainer's
metric lines from the job's CloudWatch log streams.

`start` reads the run file first (spotrun.contract.runfile.load_run_file, before any AWS call), then validates it, here,
with the estimate Lambda's own code (spotrun.pipeline.plan.plan: the same
checks, the same sources in S3, the same refusals), and starts nothing when it refuses.
`cancel` stops the execution, then the training job: SageMaker sends the trainer SIGTERM, and it saves a
checkpoint before it stops (StopExecution alone would leave the job running).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

import spotrun

from ..contract.hub_id import is_hub_id
from ..contract.refusal import Refusal
from ..contract.runfile import load_run_file
from ..contract.spec import RunSpec
from ..contract.strict_json import RunValidationError, show
from ..contract.strict_json import dumps as strict_dumps
from ..pipeline.guard import decide, has_instances
from ..pipeline.plan import plan
from ..pipeline.report import summary_text
from ..seams import (
    TRAINING_LOG_GROUP,
    Guard,
    GuardAction,
    PipelineSettings,
    Plan,
    PlanStatus,
    PreparationSettings,
    StackOutput,
    parse_metric_line,
    run_start_total_steps,
    stack_name,
)
from .arguments import run_file
from .exits import Exit, fail, for_status

_STAMP = re.compile(r"^\d{8}-\d{6}$")


class RemoteError(Exception):
    """A command cannot proceed; the message says what is missing and what to do."""


def execution_name(run_name: str, now: float) -> str:
    return f"{run_name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}"  # <= 48 + 16 of the 80 allowed


@dataclass
class Deployment:
    stack: str
    outputs: dict[str, str]
    region: str | None

    def client(self, service: str):
        import boto3  # boto3 takes ~1 s to import: only commands that call AWS load it

        return boto3.client(service, region_name=self.region)

    @property
    def state_machine_arn(self) -> str:
        return self.outputs[StackOutput.STATE_MACHINE_ARN.value]

    def estimate_settings(self):
        """The stage's estimate function's settings (its environment, which the stack outputs), in this region."""
        key = StackOutput.ESTIMATE_SETTINGS.value
        if key not in self.outputs:
            raise RemoteError(f"stack {self.stack} has no {key} output: it was deployed by an older spotrun; "
                              "`cdk deploy` this version to start runs from the CLI")
        env = json.loads(self.outputs[key])
        return PipelineSettings.from_env({**env, "AWS_REGION": self.client("stepfunctions").meta.region_name})


# The checkout's per-account configuration (stacks/config.py): the stage's region. Absent from an installed spotrun
# (the CDK app runs from the checkout), where the AWS configuration's region stands instead.
STAGE_CONFIG = Path(spotrun.__file__).resolve().parents[1] / "stacks" / "config.py"


def _environments(stage: str, config: Path) -> tuple:
    """stacks/config.py's ENVIRONMENTS (empty when the file is not here); its own errors name `--stage`."""
    if not config.is_file():
        return ()
    name = "spotrun_stage_config"
    module = sys.modules.get(name)
    if module is None or getattr(module, "__file__", None) != str(config):
        spec = importlib.util.spec_from_file_location(name, config)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up while they are made
        try:
            spec.loader.exec_module(module)  # the fork's one configuration module: plain dataclasses, no AWS call
        except ValueError as exc:  # its own checks (a region without prices, a bad name): one line, not a traceback
            del sys.modules[name]
            raise RunValidationError("--stage", stage, f"a stage whose stacks/config.py loads; it says: {exc}"
                                     ) from None
    return tuple(module.ENVIRONMENTS)


def stage_region(stage: str | None, config: Path = STAGE_CONFIG) -> str | None:
    """The region stacks/config.py deploys `stage` to, or None when the file is not here or lists no such stage."""
    if not stage:
        return None
    return next((env.region for env in _environments(stage, config) if env.stage == stage), None)


def stage_max_usd(stage: str | None, config: Path = STAGE_CONFIG) -> dict[str, float]:
    """{stage: its max_usd_per_run} from stacks/config.py: `stage`'s alone when given (empty when not listed), else
    every stage's (empty when the file is not here)."""
    listed = {env.stage: float(env.max_usd_per_run) for env in _environments(stage or "", config)}
    return {stage: listed[stage]} if stage in listed else {} if stage else listed


def unlisted_stage(stage: str, config: Path = STAGE_CONFIG) -> str:
    """What `--stage` accepts, for a stage with no region: stacks/config.py does not list it (a typo?)."""
    listed = ", ".join(env.stage for env in _environments(stage, config)) or "none: no checkout here"
    return (f"a stage of this checkout (stacks/config.py lists {listed}), or, for a stage deployed from another "
            "checkout, --region (or AWS_REGION)")


def aws_message(exc: Exception) -> str:
    """An AWS failure's line (exit 1 from every command: spotrun/cli/exits.py), with the fix for missing
    credentials."""
    if isinstance(exc, NoCredentialsError):
        return (f"{exc}: configure credentials for the stage's account (`aws configure`, AWS_PROFILE, or "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY); offline, `validate`/`estimate` take --bucket and "
                "--group instead of --stage")
    return str(exc)


def deployment(stage: str, stack: str | None = None, region: str | None = None) -> Deployment:
    """The stage's stack and outputs, in `region`, else the stage's own (stacks/config.py), else the AWS
    configuration's."""
    import boto3  # boto3 takes ~1 s to import: only commands that call AWS load it

    name = stack or stack_name(stage)
    region = region or stage_region(stage)
    try:
        found = boto3.client("cloudformation", region_name=region).describe_stacks(StackName=name)["Stacks"]
    except NoRegionError:  # no region given, stacks/config.py does not list the stage, no AWS configuration's
        raise RemoteError(f"--stage={show(stage)} is invalid: expected {unlisted_stage(stage)}") from None
    except NoCredentialsError:
        raise  # an AWS failure (exit 1, `run_command`), not a missing stage: deploying would not help
    except (ClientError, BotoCoreError) as exc:
        raise RemoteError(f"stack {name} not readable ({exc}): deploy the stage (cdk deploy '{stage}/*'), or pass "
                          "--stack / --region") from None
    outputs = {o["OutputKey"]: o["OutputValue"] for o in found[0].get("Outputs", [])}
    if StackOutput.STATE_MACHINE_ARN.value not in outputs:
        raise RemoteError(f"stack {name} has no {StackOutput.STATE_MACHINE_ARN.value} output: is it a spotrun stack?")
    return Deployment(stack=name, outputs=outputs, region=region)


# ---- executions ----------------------------------------------------------------------------------------------


def executions(sfn, state_machine_arn: str) -> list[dict]:
    """Every execution, newest first."""
    found = []
    for page in sfn.get_paginator("list_executions").paginate(stateMachineArn=state_machine_arn):
        found.extend(page["executions"])
    return sorted(found, key=lambda e: e["startDate"], reverse=True)


def find_execution(sfn, state_machine_arn: str, ref: str) -> dict:
    """The execution a RUN argument means: an ARN, an execution name, or a run name (its newest execution)."""
    if ref.startswith("arn:"):
        return latest_of_run(sfn, sfn.describe_execution(executionArn=ref))
    every = executions(sfn, state_machine_arn)
    exact = [e for e in every if e["name"] == ref]
    of_run = [e for e in every if e["name"].startswith(ref + "-") and _STAMP.match(e["name"][len(ref) + 1:])]
    chosen = (exact or of_run or [None])[0]
    if chosen is None:
        raise RemoteError(f"no execution of run {ref!r} on {state_machine_arn}: `spotrun list` shows them")
    return latest_of_run(sfn, sfn.describe_execution(executionArn=chosen["executionArn"]))


def latest_of_run(sfn, execution: dict) -> dict:
    """The execution that runs (or ran) the run now: an execution that continued its run in a fresh one
    (spotrun/pipeline/continuation.py) names it in its output (`continued_as`)."""
    while execution["status"] == "SUCCEEDED":
        successor = json.loads(execution.get("output") or "{}").get("continued_as")
        if not successor:
            break
        arn = execution["executionArn"].rsplit(":", 1)[0] + ":" + successor
        execution = sfn.describe_execution(executionArn=arn)
    return execution


# The latter: on the prepared shards (spotrun/pipeline/preparation.py); ContinueRun: a continued run's carried plan.
ESTIMATE_STATES = ("Estimate", "EstimatePrepared", "ContinueRun")


def pipeline_state(sfn, execution_arn: str) -> tuple[dict | None, dict | None]:
    """(the estimate's latest plan: EstimatePrepared's after a preparation, else Estimate's; the CostGuard's
    latest decision) from the execution's history: the newest by event id, whatever order the history comes in
    (asked newest first; moto's ignores reverseOrder)."""
    newest: dict[str, tuple[int, dict]] = {}
    pages = sfn.get_paginator("get_execution_history").paginate(executionArn=execution_arn, reverseOrder=True)
    for page in pages:
        for event in page["events"]:
            details = event.get("stateExitedEventDetails") or {}
            name = details.get("name")
            if name not in (*ESTIMATE_STATES, "CostGuard", "InitGuard") or "output" not in details:
                continue
            output = json.loads(details["output"])
            kinds = ("plan", "guard") if name == "ContinueRun" else \
                ("plan",) if name in ESTIMATE_STATES else ("guard",)
            for kind in kinds:
                value = output.get(kind)
                if value is not None and (kind not in newest or event["id"] > newest[kind][0]):
                    newest[kind] = (event["id"], value)
        events = page["events"]
        if len(newest) == 2 and events and events[0]["id"] > events[-1]["id"]:
            break  # newest first, and both found: the rest is older
    return newest.get("plan", (0, None))[1], newest.get("guard", (0, None))[1]


def training_job(sm, name: str | None) -> dict | None:
    if not name:
        return None
    try:
        return sm.describe_training_job(TrainingJobName=name)
    except ClientError:
        return None  # not created yet (or the plan refused the run)


def log_streams(logs, job_name: str) -> list[str]:
    try:
        pages = logs.get_paginator("describe_log_streams").paginate(logGroupName=TRAINING_LOG_GROUP,
                                                                    logStreamNamePrefix=job_name)
        return [s["logStreamName"] for page in pages for s in page["logStreams"]]
    except ClientError:
        return []  # no log group yet: no job has logged in this account and region


def stream_events(logs, stream: str, token: str | None = None) -> tuple[list[dict], str | None]:
    """New events of one stream after `token` (oldest first) and the token to continue from."""
    events = []
    while True:
        kwargs = {"nextToken": token} if token else {"startFromHead": True}
        page = logs.get_log_events(logGroupName=TRAINING_LOG_GROUP, logStreamName=stream, **kwargs)
        events.extend(page["events"])
        if not page["events"] or page.get("nextForwardToken") in (None, token):
            return events, page.get("nextForwardToken") or token
        token = page["nextForwardToken"]


def latest_metrics(logs, job_name: str) -> dict | None:
    """The trainer's newest metric line (step, loss, ...) over the job's streams, and total_steps if logged."""
    newest, total = None, None
    for stream in log_streams(logs, job_name):
        events, _ = stream_events(logs, stream)
        for event in events:
            message = event["message"]
            started = run_start_total_steps(message)
            total = total if started is None else started
            parsed = parse_metric_line(message)
            if parsed and (newest is None or parsed["step"] >= newest["step"]):
                newest = parsed
    if newest is not None and total is not None:
        newest["total_steps"] = total
    return newest


# ---- commands ------------------------------------------------------------------------------------------------


def _sources_in_s3(run: RunSpec) -> None:
    """A local path cannot be a stage's source: refused before credentials are asked for (the estimate's own check,
    spotrun/pipeline/validate.py, names the bucket once the stack is read)."""
    for field_path, value in (("model.source", run.model.source), ("data.source", run.data.source),
                              ("data.validation", run.data.validation)):
        if value and not value.startswith("s3://") and not (field_path == "model.source" and is_hub_id(value)):
            raise RunValidationError(field_path, value, "an s3:// URI under the stage's bucket for `spotrun start` "
                                     "(`spotrun prepare --stage` and `spotrun upload-model` upload local data and "
                                     "models and print it; local paths are for `spotrun local`)")


def start(args: argparse.Namespace) -> dict:
    loaded = load_run_file(args.run)  # the run file first: a bad one fails here, before any AWS call
    raw = loaded.raw
    _sources_in_s3(loaded.run)
    dep = deployment(args.stage, args.stack, args.region)
    name = args.execution_name or execution_name(loaded.run.name, time.time())
    settings = dep.estimate_settings()
    # The estimate Lambda's checks, run here; raw text under datasets/ is answered Prepare
    # (spotrun/pipeline/preparation.py).
    preparation = PreparationSettings.from_env(json.loads(dep.outputs[StackOutput.ESTIMATE_SETTINGS.value]))
    checked = plan(raw, name, settings, s3_client=dep.client("s3"), preparation=preparation)
    if checked["status"] not in (PlanStatus.OK.value, PlanStatus.PREPARE.value):
        return {"error": checked["status"], "message": checked["message"], "field": checked.get("field"),
                "started": False}
    arn = dep.client("stepfunctions").start_execution(stateMachineArn=dep.state_machine_arn, name=name,
                                                      input=json.dumps(raw))["executionArn"]
    if checked["status"] == PlanStatus.PREPARE.value:  # planned after the preparation job, in the pipeline
        return {"started": True, "run": raw.get("name"), "execution": name, "execution_arn": arn,
                "preparation": checked["message"]}
    est = checked["estimate"]
    return {"started": True, "run": checked["run_name"], "execution": name, "execution_arn": arn,
            "job_name": checked["job_name"],
            "instance": f"{est['instance_count']} x {est['instance_type']}", "estimated_cost_usd": est["cost_usd"],
            "cap_usd": checked["max_usd"]}


def run_status(dep: Deployment, execution: dict) -> dict:
    plan_json, guard_json = pipeline_state(dep.client("stepfunctions"), execution["executionArn"])
    out: dict[str, Any] = {"execution": execution["name"], "state": execution["status"],
                           "started": str(execution["startDate"]), "run": (plan_json or {}).get("run_name")}
    if execution.get("stopDate"):
        out["stopped"] = str(execution["stopDate"])
    if execution.get("error"):
        out["error"], out["cause"] = execution["error"], execution.get("cause", "")
    if plan_json and plan_json.get("status") == PlanStatus.PREPARE.value:  # the preparation job runs; planned after
        out["preparing"] = plan_json.get("message", "")
        return out
    if not plan_json or plan_json.get("status") not in (None, "ok"):
        if plan_json:
            out["refused"] = {"status": plan_json["status"], "message": plan_json.get("message", "")}
        return out
    plan = Plan.from_json(plan_json, "plan")
    # Before the first poll: the guard the state machine's InitGuard starts with.
    guard = Guard.from_json(guard_json, "guard") if guard_json else Guard(
        action=GuardAction.WAIT, job_name=plan.job_name, spot=plan.spot, wait_seconds=plan.poll_seconds,
        spent_before_usd=plan.spent_before_usd, interruptions_before=0)
    job_name = guard.job_name or plan.job_name
    out["job_name"] = job_name
    # the current job's market, and the spot policy the guard executes (the estimate's choice, as the plan carries it)
    out["market"] = "spot" if guard.spot else "on-demand"
    out["spot_policy"] = plan.estimate.spot_policy.chosen if plan.estimate.spot_policy else None
    job = training_job(dep.client("sagemaker"), job_name)
    sentinel = training_job(dep.client("sagemaker"), guard.sentinel_name)
    if job is not None:
        out["job_status"], out["secondary_status"] = job["TrainingJobStatus"], job.get("SecondaryStatus")
        # the cost guard's arithmetic, on the job (and the sentinel beside it, if any) as they are now
        spend = decide(plan, guard, job, now=time.time(), sentinel=sentinel)
        out["interruptions"] = spend.interruptions
        out["spent_usd"] = spend.cost_usd
    else:
        out["interruptions"] = guard.interruptions
        out["spent_usd"] = guard.cost_usd
    if guard.sentinel_name:  # a spot job waiting for capacity beside the on-demand job (spotrun/pipeline/guard.py)
        out["sentinel"] = guard.sentinel_name
        out["sentinel_status"] = _sentinel_status(sentinel, guard.sentinel_stopping)
    # The run's jobs so far (spotrun/planner/segments.py): the current one and those that ended, with their exact
    # bills.
    out["segment"] = guard.segment
    out["segments"] = guard.segments
    out["cap_usd"] = plan.max_usd
    metrics = latest_metrics(dep.client("logs"), job_name)
    if metrics:
        out.update(step=metrics["step"], total_steps=metrics.get("total_steps"), loss=metrics["loss"])
    return out


def _sentinel_status(describe: dict | None, stopping: bool) -> str:
    """A live sentinel's state in a few words: its SageMaker status, and whether it holds spot capacity."""
    if describe is None:
        return "being created"
    state = "/".join(s for s in (describe.get("TrainingJobStatus"), describe.get("SecondaryStatus")) if s)
    seen = "spot capacity seen" if has_instances(describe) else "waiting for spot capacity"
    return f"{state} ({seen}{'; the guard is stopping it' if stopping else ''})"


def status(args: argparse.Namespace) -> list[dict]:
    dep = deployment(args.stage, args.stack, args.region)
    sfn = dep.client("stepfunctions")
    if args.run:
        chosen = [find_execution(sfn, dep.state_machine_arn, args.run)]
    else:
        every = executions(sfn, dep.state_machine_arn)
        chosen = [e for e in every if e["status"] == "RUNNING"] or every[:1]
        chosen = [sfn.describe_execution(executionArn=e["executionArn"]) for e in chosen]
    return [run_status(dep, e) for e in chosen]


def report(args: argparse.Namespace) -> dict:
    dep = deployment(args.stage, args.stack, args.region)
    execution = find_execution(dep.client("stepfunctions"), dep.state_machine_arn, args.run)
    if execution["status"] == "SUCCEEDED":
        output = json.loads(execution["output"])
        return {**output["report"], "model_package_arn": output.get("model_package_arn"),
                "execution": execution["name"], "preparation": output.get("preparation") or None}
    return {"status": execution["status"], **run_status(dep, execution)}  # running, failed or cancelled so far


def cancel(args: argparse.Namespace) -> dict:
    dep = deployment(args.stage, args.stack, args.region)
    sfn = dep.client("stepfunctions")
    execution = find_execution(sfn, dep.state_machine_arn, args.run)
    if execution["status"] != "RUNNING":
        raise RemoteError(f"execution {execution['name']} is {execution['status']}: nothing to cancel")
    plan, guard = pipeline_state(sfn, execution["executionArn"])
    # The execution first: stopped after the job, its next poll would report the stop as a training failure.
    sfn.stop_execution(executionArn=execution["executionArn"], error="Cancelled",
                       cause="cancelled with spotrun cancel")
    out = {"execution": execution["name"], "execution_stopped": True, "job_stopped": False}
    job_name = (guard or {}).get("job_name") or (plan or {}).get("job_name")
    sm = dep.client("sagemaker")
    job = training_job(sm, job_name)
    if job is not None and job["TrainingJobStatus"] == "InProgress":
        sm.stop_training_job(TrainingJobName=job_name)  # SIGTERM to the trainer: it saves, then stops
        out["job_stopped"] = True
    out["job_name"] = job_name
    return out


def list_runs(args: argparse.Namespace) -> list[dict] | int:
    if args.limit < 1:  # before the stack is read; a slice by -3 listed all but the oldest 3
        return fail(getattr(args, "format", "text"), Exit.INVALID, "InvalidArguments", f"--limit={args.limit} is "
                    "invalid: expected a whole number of runs, 1 or more (default 50)", "--limit")
    dep = deployment(args.stage, args.stack, args.region)
    return [{"execution": e["name"], "state": e["status"], "started": str(e["startDate"]),
             "stopped": str(e["stopDate"]) if e.get("stopDate") else None}
            for e in executions(dep.client("stepfunctions"), dep.state_machine_arn)[:args.limit]]


def logs(args: argparse.Namespace) -> int:
    dep = deployment(args.stage, args.stack, args.region)
    sfn, sm, cw = dep.client("stepfunctions"), dep.client("sagemaker"), dep.client("logs")
    execution = find_execution(sfn, dep.state_machine_arn, args.run)
    plan, guard = pipeline_state(sfn, execution["executionArn"])
    if not plan or plan.get("status") != "ok":
        raise RemoteError(f"execution {execution['name']} started no training job (its plan: "
                          f"{(plan or {}).get('message', 'not made yet')})")
    prefix = plan["job_name"]  # also the prefix of the on-demand fallback job (<name>-od)
    tokens: dict[str, str | None] = {}
    while True:
        streams = log_streams(cw, prefix)
        for stream in streams:
            events, tokens[stream] = stream_events(cw, stream, tokens.get(stream))
            for event in events:
                print(f"{stream}  {event['message']}" if len(streams) > 1 else event["message"], flush=True)
        if not args.follow:
            return 0
        job = training_job(sm, (guard or {}).get("job_name") or prefix)
        running = sfn.describe_execution(executionArn=execution["executionArn"])["status"] == "RUNNING"
        if not running and (job is None or job["TrainingJobStatus"] != "InProgress"):
            return 0
        time.sleep(args.poll_seconds)
        plan, guard = pipeline_state(sfn, execution["executionArn"])


# ---- argument parsing and printing ---------------------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "\n\n".join(_text(v) for v in value)
    if isinstance(value, dict) and "billable_seconds" in value and "estimated_cost_usd" in value:
        return summary_text(value)
    return "\n".join(_field_text(k, v) for k, v in value.items() if v is not None)


def _field_text(key: str, value: Any) -> str:
    """One field of a text answer; a list of records (`status`'s ended jobs with their bills) one record a line,
    not as a Python list of dicts on one line; a dict (`start`'s estimated costs, `undeploy`'s deleted names) as
    JSON."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        records = ("  " + " ".join(f"{k}={v}" for k, v in record.items() if v is not None) for record in value)
        return f"{key:<18} {len(value)}\n" + "\n".join(records)
    if isinstance(value, dict):  # JSON, as the user writes it (not a Python dict's repr)
        return f"{key:<18} {json.dumps(value)}"
    return f"{key:<18} {value}"


def _table(rows: list[dict]) -> str:
    if not rows:
        return "no executions"
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in keys}
    lines = ["  ".join(k.ljust(widths[k]) for k in keys)]
    lines += ["  ".join(str(r[k]).ljust(widths[k]) for k in keys) for r in rows]
    return "\n".join(lines)


def run_command(fn, args: argparse.Namespace) -> int:
    """Run a remote command; its exit code from spotrun/cli/exits.py. With `--format json` an error is one JSON
    document on stdout (as a refused `start` is), else one line on stderr, `error: <error>: <message>` as every
    command's (RemoteError: the stage, its stack or the run is not as the command needs)."""
    fmt = getattr(args, "format", "text")
    try:
        result = fn(args)
    except Refusal as exc:  # the run file (spotrun.contract.runfile.load_run_file)
        return fail(fmt, for_status(exc.status), exc.status, exc.message, exc.field)
    except RemoteError as exc:
        return fail(fmt, Exit.INVALID, "RemoteError", str(exc))
    except (ClientError, BotoCoreError) as exc:
        return fail(fmt, Exit.FAILED, "AWS", aws_message(exc))
    if isinstance(result, int):
        return result
    if fmt == "json":
        print(strict_dumps(result, indent=2, default=str))
    elif fn is list_runs:
        print(_table(result))
    else:
        print(_text(result))
    if isinstance(result, dict) and result.get("error"):
        return int(for_status(result["error"]))
    return int(Exit.OK)



def common(p, *, fmt: bool = True) -> None:
    """The arguments of every command on a deployed stage (these and spotrun/cli/deploy.py's)."""
    p.add_argument("--stage", default="dev", help="the deployed stage (stacks/config.py; default dev)")
    p.add_argument("--stack", help="CloudFormation stack name (default <stage>-Spotrun)")
    p.add_argument("--region", help="AWS region (default: the stage's, stacks/config.py; else the AWS "
                   "configuration's)")
    if fmt:
        p.add_argument("--format", choices=["text", "json"], default="text",
                       help="text (default) or one JSON document")


def register(sub) -> None:
    p = sub.add_parser("start", help="validate a run JSON here, then start it on the stage's state machine")
    p.add_argument("run", type=run_file("run"), help="run JSON file (s3:// sources under the stack's bucket)")
    p.add_argument("--execution-name", help="execution name (default <run name>-<UTC time>)")
    common(p)
    p.set_defaults(func=lambda a: run_command(start, a))
    p = sub.add_parser("status", help="state, market (spot or on-demand), spot policy, a live sentinel, step, loss, "
                       "interruptions and spend vs cap of a run (default: the running ones)")
    p.add_argument("run", nargs="?", help="run name, execution name or ARN")
    common(p)
    p.set_defaults(func=lambda a: run_command(status, a))
    p = sub.add_parser("logs", help="the training job's CloudWatch log streams")
    p.add_argument("run", help="run name, execution name or ARN")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    p.add_argument("--poll-seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    common(p, fmt=False)
    p.set_defaults(func=lambda a: run_command(logs, a))
    p = sub.add_parser("report", help="billable vs training seconds, savings, cost, interruptions, model package")
    p.add_argument("run", help="run name, execution name or ARN")
    common(p)
    p.set_defaults(func=lambda a: run_command(report, a))
    p = sub.add_parser("cancel", help="stop a run: the execution, then the training job (the trainer saves first)")
    p.add_argument("run", help="run name, execution name or ARN")
    common(p)
    p.set_defaults(func=lambda a: run_command(cancel, a))
    p = sub.add_parser("list", help="the stage's runs (executions), newest first")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    common(p)
    p.set_defaults(func=lambda a: run_command(list_runs, a))
