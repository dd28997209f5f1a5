"""The seams, proven with the other party: every request the state machine can send, built from the real handlers'
outputs with the `.$` paths and intrinsics resolved, is validated against botocore's service models (types,
required members, lengths, ranges, enums, patterns) and the API reference's prose rules; every $.plan/$.guard path
exists in what the handlers return; the plan's hyperparameters parse into the trainer's config; and the longest
run the contract allows stays under half of the execution history quota."""

from __future__ import annotations

import copy
import hashlib
import json
import re

import botocore.session
import pytest
import regex  # the service models' patterns use \p{...} classes, which `re` lacks
from botocore.validate import ParamValidator

from spotrun.contract.spec import MAX_RUNTIME_LIMIT_S
from spotrun.pipeline import guard as guard_rules
from spotrun.pipeline import launch
from spotrun.pipeline.plan import PipelineSettings, plan
from spotrun.planner.estimate import load_catalog
from spotrun.seams import (
    COMPLETED_METRIC,
    EXECUTION_TAG,
    GUARD_FIELDS,
    PLAN_FIELDS,
    REFUSAL_FIELDS,
    REPORT_FIELDS,
    Guard,
    Plan,
)
from spotrun.settings.wire import job_config
from tests.infra.render import render


def decide(plan: dict, guard: dict, describe: dict, **kwargs) -> dict:
    """The cost guard's rule on the JSON the state machine carries, as its handler calls it: decoded at entry
    (spotrun.seams.Plan, Guard), encoded on return."""
    return guard_rules.decide(Plan.from_json(plan), Guard.from_json(guard), describe, **kwargs).to_json()


def next_wait(plan: dict, job_age_s: float, spent_usd: float) -> int:
    return guard_rules.next_wait(Plan.from_json(plan), job_age_s, spent_usd)


HISTORY_QUOTA = 25_000  # events per Standard execution (Step Functions quotas)
# Events each state adds to the history (Step Functions history event types per state type).
EVENTS = {"Wait": 2, "Pass": 2, "Choice": 2, "Task": 5, "Fail": 1, "Succeed": 1}
BUCKET = "art-bucket"
RUN = {"version": 1, "name": "seam-run",
       "model": {"config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256}, "init": "random"},
       "data": {"source": f"s3://{BUCKET}/datasets/d/", "tokens": 1_000_000, "seq_len": 128,
                "validation": f"s3://{BUCKET}/datasets/d-val/"},  # the `validation` channel goes through the model
       "eval": {"every_steps": 50, "max_batches": 20, "keep_best": True}, "export": {"from": "best"},
       "registry": {"gate": {"max_val_loss": 3.0, "min_improvement": 0.05}},
       "compute": {"instance_type": "ml.g5.2xlarge", "on_demand_fallback": True},
       "budget": {"max_usd": 50}, "tags": {"team": "nlp"}}
T0 = 1_767_225_600.0
MLFLOW_ARN = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/ml-team"


@pytest.fixture(scope="module")
def rendered(synth) -> dict:
    """The definition with every reference rendered to a value of the right kind for its resource type."""
    resources = synth.template["Resources"]

    def resolve(logical: str, attr: str | None) -> str:
        kind = resources[logical]["Type"]
        if kind == "AWS::IAM::Role":
            return f"arn:aws:iam::123456789012:role/{logical}"
        if kind == "AWS::KMS::Key":
            return "arn:aws:kms:us-east-1:123456789012:key/0a1b2c3d-0000-4000-8000-000000000000"
        if kind == "AWS::S3::Bucket":
            return BUCKET if attr is None else f"arn:aws:s3:::{BUCKET}"
        if kind == "AWS::SNS::Topic":
            return f"arn:aws:sns:us-east-1:123456789012:{logical}"
        if kind == "AWS::Lambda::Function":
            return f"arn:aws:lambda:us-east-1:123456789012:function:{logical}"
        raise KeyError(f"{logical} ({kind})")

    _, sm = synth.one("AWS::StepFunctions::StateMachine")
    return json.loads(render(sm["Properties"]["DefinitionString"], resolve))


def settings(synth) -> PipelineSettings:
    fn = next(r for k, r in synth.resources("AWS::Lambda::Function").items() if k.startswith("PipelineEstimateFn"))
    env = fn["Properties"]["Environment"]["Variables"]
    return PipelineSettings(bucket=BUCKET, job_prefix=env["JOB_PREFIX"], model_package_group="g",
                            poll_seconds=int(env["POLL_SECONDS"]), project=env["PROJECT"], stage=env["STAGE"],
                            cost_center=env["COST_CENTER"], max_poll_seconds=int(env["MAX_POLL_SECONDS"]),
                            volume_kms_key_arn="arn:aws:kms:us-east-1:123456789012:key/k",
                            mlflow_tracking_servers=(MLFLOW_ARN,))


def states_for_every_branch(synth, rendered: dict) -> list[tuple[str, dict]]:
    """(branch, execution state) pairs made of the real handlers' outputs, one per way a request is sent. The
    first guard is what the rendered InitGuard state makes of the plan."""
    out = []
    # The on-demand run's data source is longer than a metadata value and has characters the pattern refuses.
    long_source = f"s3://{BUCKET}/datasets/" + "(v2)é,x;" * 40 + "/"
    done_metrics = [{"MetricName": "train:loss", "Value": 1.5}, {"MetricName": COMPLETED_METRIC, "Value": 10},
                    {"MetricName": "train:base_val_loss", "Value": 3.25},
                    {"MetricName": "train:exported_val_loss", "Value": 1.0625e-05}]
    tracked = {"tracking": {"mlflow_uri": MLFLOW_ARN, "experiment": "support bot v2"}}
    for label, compute, source, extra in (
            ("spot", {}, RUN["data"]["source"], {}),
            ("on-demand", {"spot": False, "warm_pool_minutes": 30}, long_source, {}),
            ("tracked spot", {}, RUN["data"]["source"], tracked),  # SageMaker's MLflow: MlflowConfig sent
            ("tracked on-demand", {"spot": False}, RUN["data"]["source"], tracked)):
        run = copy.deepcopy(RUN)
        run["compute"].update(compute)
        run.update(extra)
        run["data"]["source"] = source
        # Execution names as `spotrun start` makes them, and the characters a tag value allows beyond those.
        p = plan(run, f"exec-{label}_v2.1:a=b+c@d", settings(synth), started="2026-01-01T00:00:00Z")
        assert p["status"] == "ok", p
        guard = resolve_parameters(rendered["States"]["InitGuard"]["Parameters"], {"plan": p})
        running = {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Training", "CreationTime": T0,
                   "TrainingStartTime": T0}
        out.append((f"{label}: first create", {"run": run, "plan": p, "guard": guard}))
        out.append((f"{label}: stop", {"run": run, "plan": p, "guard": decide(p, guard, running, now=T0 + 1e6)}))
        segment_end = decide(p, guard, {"TrainingJobStatus": "Completed", "SecondaryStatus": "Completed",
                                        "BillableTimeInSeconds": 100, "CreationTime": T0}, now=T0 + 500)
        assert segment_end["action"] == "segment", segment_end
        out.append((f"{label}: next segment create", {"run": run, "plan": p, "guard": segment_end}))
        # The same boundary with the execution's history nearly full: the run continues in a fresh execution.
        full = decide(p, {**guard, "history_events": 20_000}, {
            "TrainingJobStatus": "Completed", "SecondaryStatus": "Completed", "BillableTimeInSeconds": 100,
            "CreationTime": T0}, now=T0 + 500)
        assert full["action"] == "continue" and full["next_execution"].endswith("-s2"), full
        out.append((f"{label}: continue in a fresh execution", {"run": run, "plan": p, "guard": full}))
        fallback = decide(p, guard, {"TrainingJobStatus": "Stopped", "SecondaryStatus": "MaxWaitTimeExceeded",
                                     "BillableTimeInSeconds": 10, "CreationTime": T0}, now=T0 + 10)
        if label.endswith("spot"):
            assert fallback["action"] == "fallback"
            out.append((f"{label}: fallback create", {"run": run, "plan": p, "guard": fallback}))
        done = decide(p, segment_end, {"TrainingJobStatus": "Completed", "BillableTimeInSeconds": 100,
                                       "TrainingTimeInSeconds": 300, "CreationTime": T0,
                                       "FinalMetricDataList": done_metrics,
                                       "ModelArtifacts": {"S3ModelArtifacts": f"s3://{BUCKET}/output/j/output/"
                                                                              "model.tar.gz"}},
                      now=T0 + 900)
        assert done["action"] == "completed", done  # the gate passed: the package metadata carries both losses
        out.append((f"{label}: register", {"run": run, "plan": p, "guard": done, "registered": {}}))
        failed = decide(p, guard, {"TrainingJobStatus": "Failed", "FailureReason": "boom", "CreationTime": T0},
                        now=T0)
        out.append((f"{label}: failed", {"run": run, "plan": p, "guard": failed,
                                         "error": {"Cause": "an error", "Error": "States.TaskFailed"}}))
    # A run with a deadline: the spot policy's stop of a spot job waiting for capacity (behind the policy), and the
    # on-demand segment that follows it on the same checkpoints.
    run = copy.deepcopy(RUN)
    run["compute"]["deadline_hours"] = 1
    p = plan(run, "exec-deadline", settings(synth), started="2026-01-01T00:00:00Z")
    guard = resolve_parameters(rendered["States"]["InitGuard"]["Parameters"], {"plan": p})
    waiting = {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Interrupted", "CreationTime": T0,
               "TrainingStartTime": T0}
    switch = decide(p, guard, waiting, now=T0 + 3500, checkpoint_step=0)
    assert switch["action"] == "stop" and switch["switch_requested"], switch
    out.append(("deadline: the policy's stop", {"run": run, "plan": p, "guard": switch}))
    switched = decide(p, switch, {"TrainingJobStatus": "Stopped", "SecondaryStatus": "Stopped",
                                  "BillableTimeInSeconds": 10, "CreationTime": T0}, now=T0 + 3510, checkpoint_step=0)
    assert switched["action"] == "segment" and switched["spot"] is False, switched
    out.append(("deadline: on-demand after the policy's stop", {"run": run, "plan": p, "guard": switched}))
    for label, mutate in (("over budget", lambda r: r.update(budget={"max_usd": 0.001})),
                          ("invalid run", lambda r: r.update(name="not a name"))):
        run = copy.deepcopy(RUN)
        mutate(run)
        refused = plan(run, "exec-refused", settings(synth))
        assert refused["status"] in ("OverBudget", "InvalidRun"), refused
        out.append((label, {"run": run, "plan": refused}))
    out += preparing_states(synth)
    return out


class _FailedProcessing:
    def describe_processing_job(self, ProcessingJobName):  # noqa: N803 - boto3's keyword
        return {"ProcessingJobName": ProcessingJobName, "ProcessingJobStatus": "Failed",
                "FailureReason": "AlgorithmError: x.jsonl:2: not valid JSON", "ProcessingStartTime": T0,
                "ProcessingEndTime": T0 + 300}


def preparing_states(synth) -> list[tuple[str, dict]]:
    """Raw text under datasets/ (in moto S3): the estimate's Prepare answer, which the preparation job's requests
    are built from, and the finish step's answer for a failed job (tests/infra/test_preparation.py runs that
    branch in moto)."""
    from moto import mock_aws

    from spotrun.pipeline.preparation_finish import finish
    from spotrun.seams import PreparationSettings

    fn = next(r for k, r in synth.resources("AWS::Lambda::Function").items() if k.startswith("PipelineEstimateFn"))
    run = copy.deepcopy(RUN)
    run["model"] = {"source": f"s3://{BUCKET}/models/m/"}
    run["data"] = {"source": f"s3://{BUCKET}/datasets/raw/", "seq_len": 128, "validation_fraction": 0.1}
    with mock_aws():
        import boto3

        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        for key in ("datasets/raw/a.jsonl", "datasets/raw/b.jsonl.gz", "datasets/raw/c.parquet",
                    "models/m/tokenizer.json", "models/m/model.safetensors"):
            s3.put_object(Bucket=BUCKET, Key=key, Body=b"{}")
        # The estimate reads the model's config before preparing (the training's minimum the cap must keep).
        s3.put_object(Bucket=BUCKET, Key="models/m/config.json", Body=json.dumps(RUN["model"]["config"]).encode())
        p = plan(run, "exec-prep", settings(synth), s3_client=s3,
                 preparation=PreparationSettings.from_env(fn["Properties"]["Environment"]["Variables"]))
        assert p["status"] == "Prepare", p
        failed = finish(s3, _FailedProcessing(), p["preparation"])
    assert failed["status"] == "failed", failed
    return [("prepare", {"run": run, "plan": p}), ("prepare: failed", {"run": run, "plan": p, "prepared": failed})]


def lookup(state: dict, path: str):
    if path == "$":
        return state
    value = state
    for part in path.removeprefix("$.").split("."):
        value = value[part]
    return value


def resolve_parameters(params, state: dict):
    """Parameters with `.$` keys resolved against the state (JSONPath and States.Format, as Step Functions does)."""
    if isinstance(params, list):
        return [resolve_parameters(p, state) for p in params]
    if not isinstance(params, dict):
        return params
    out = {}
    for key, value in params.items():
        if not key.endswith(".$"):
            out[key] = resolve_parameters(value, state)
            continue
        m = re.fullmatch(r"States\.Format\('(.*)', (.*)\)", value)
        if m:
            args = [lookup(state, a.strip()) for a in m.group(2).split(",")]
            text = m.group(1)
            for arg in args:
                text = text.replace("{}", str(arg), 1)
            out[key[:-2]] = text
        elif value.startswith("$$."):
            out[key[:-2]] = "exec-context"
        else:
            out[key[:-2]] = lookup(state, value)
    return out


def request_problems(request: dict, service: str, operation: str) -> list[str]:
    """Everything botocore's model says is wrong with a request: ParamValidator's report (types, required members)
    and `check_shape`'s (lengths, values, enums, full-match patterns)."""
    model = botocore.session.get_session().get_service_model(service).operation_model(operation)
    report = ParamValidator().validate(request, model.input_shape)
    problems = [report.generate_report()] if report.has_errors() else []
    check_shape(request, model.input_shape, operation, problems)
    return problems


def check_shape(value, shape, where: str, problems: list[str]) -> None:
    """What botocore's ParamValidator leaves out: maximum lengths and values, enums, patterns."""
    meta = shape.metadata
    if shape.type_name == "structure":
        for name, member in shape.members.items():
            if name in value:
                check_shape(value[name], member, f"{where}.{name}", problems)
    elif shape.type_name == "list":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{where}: {len(value)} items > {meta['max']}")
        for i, item in enumerate(value):
            check_shape(item, shape.member, f"{where}[{i}]", problems)
    elif shape.type_name == "map":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{where}: {len(value)} entries > {meta['max']}")
        for k, v in value.items():
            check_shape(k, shape.key, f"{where} key", problems)
            check_shape(v, shape.value, f"{where}[{k}]", problems)
    elif shape.type_name == "string":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{where}: {len(value)} characters > {meta['max']}")
        if shape.enum and value not in shape.enum:
            problems.append(f"{where}: {value!r} not in {shape.enum}")
        # A full match: `search` finds the empty match of `(...)*` in any string.
        if "pattern" in meta and not regex.fullmatch(meta["pattern"], value):
            problems.append(f"{where}: {value!r} does not match {meta['pattern']}")
    elif shape.type_name in ("integer", "long") and "max" in meta and value > meta["max"]:
        problems.append(f"{where}: {value} > {meta['max']}")


def prose_rules(action: str, params: dict, problems: list[str]) -> None:
    """Constraints the API reference states only in words."""
    if action == "CreateTrainingJob":
        resource = params["ResourceConfig"]
        family = resource["InstanceType"].split(".")[1]
        # "You can't request a VolumeKmsKeyId when using an instance type with local storage." (ResourceConfig)
        if "VolumeKmsKeyId" in resource and load_catalog()["families"][family]["local_storage"]:
            problems.append(f"VolumeKmsKeyId with {resource['InstanceType']}, which has local storage")
        stop = params["StoppingCondition"]
        if params["EnableManagedSpotTraining"]:
            if stop.get("MaxWaitTimeInSeconds", 0) < stop["MaxRuntimeInSeconds"]:
                problems.append("MaxWaitTimeInSeconds < MaxRuntimeInSeconds")
            if "KeepAlivePeriodInSeconds" in resource:
                problems.append("managed warm pools cannot be used with spot training")
        if any(len(v) > 2500 for v in params.get("HyperParameters", {}).values()):
            problems.append("a hyperparameter value is longer than 2,500 characters")


def _service_call(state_def: dict) -> tuple[str, str] | None:
    resource = state_def.get("Resource", "")
    if re.fullmatch(r"arn:aws:lambda:[\w-]+:\d+:function:PipelineLauncherFn\w+", resource):
        return "sagemaker", "CreateTrainingJob"  # the launch function sends its payload (spotrun/pipeline/launch.py)
    m = re.fullmatch(r"arn:aws:states:::aws-sdk:(\w+):(\w+)", resource)
    if m:
        return m.group(1), m.group(2)[0].upper() + m.group(2)[1:]
    if resource == "arn:aws:states:::sns:publish":
        return "sns", "Publish"
    if resource == "arn:aws:states:::states:startExecution":
        return "stepfunctions", "StartExecution"
    return None


def _as_the_service_sends(action: str, params: dict) -> dict:
    """The optimized `states:startExecution` integration takes StateMachineArn, Name and Input (an object is sent
    as its JSON text) and calls StartExecution (stateMachineArn, name, input). The launch function sends its
    payload with SessionChainingConfig, for the run its tags name."""
    if action == "CreateTrainingJob":
        assert launch.run_of(params) == RUN["name"]
        return launch.training_job_request(params)
    if action != "StartExecution":
        return params
    return {k[0].lower() + k[1:]: json.dumps(v) if k == "Input" and not isinstance(v, str) else v
            for k, v in params.items()}


def test_every_request_on_every_branch_is_valid_for_the_real_api(synth, rendered):
    session = botocore.session.get_session()
    calls = {name: (_service_call(s), s) for name, s in rendered["States"].items() if _service_call(s)}
    assert {c[0][1] for c in calls.values()} == {"CreateTrainingJob", "StopTrainingJob", "CreateModelPackage",
                                                 "Publish", "CreateProcessingJob", "DescribeProcessingJob",
                                                 "StartExecution"}
    checked = set()
    for branch, state in states_for_every_branch(synth, rendered):
        for name, ((service, action), definition) in calls.items():
            try:
                params = _as_the_service_sends(action, resolve_parameters(definition["Parameters"], state))
            except (KeyError, TypeError):
                continue  # this state is not reached on this branch (e.g. register before completion)
            if name.startswith("Create") and "TrainingJob" in name and (
                    name.startswith("CreateSpot") != bool(state["guard"]["spot"])
                    or name.endswith("Tracked") != bool(state["plan"].get("mlflow_config"))):
                continue  # spot or on-demand as the guard (or the plan, first) says; MlflowConfig as the plan says
            if action == "StartExecution" and state.get("guard", {}).get("action") != "continue":
                continue  # only a guard that answered `continue` reaches it
            model = session.get_service_model(service).operation_model(action)
            report = ParamValidator().validate(params, model.input_shape)
            assert not report.has_errors(), f"{branch} / {name}: {report.generate_report()}"
            problems: list[str] = []
            check_shape(params, model.input_shape, action, problems)
            prose_rules(action, params, problems)
            assert problems == [], f"{branch} / {name}"
            checked.add(name)
    assert checked == set(calls), set(calls) - checked


def test_the_cost_guards_sentinel_request_is_valid_for_the_real_api(synth, rendered):
    """The sentinel the cost guard creates (spotrun/pipeline/guard.py `sentinel_request`): the CostGuard state's
    template resolved on a real plan whose run name is cut to fit, the run's last sentinel name and the longest
    limits, sent as the launch function sends it: valid for botocore's model and the prose rules, managed spot,
    no channel, no checkpoint, the run's instance type and count, tagged with the run and the execution."""
    run = copy.deepcopy(RUN)
    run["name"] = "sentinel-" + "x" * 39  # 48 characters: the longest a run name may be
    p = plan(run, "exec-sentinel", settings(synth), started="2026-01-01T00:00:00Z")
    assert p["status"] == "ok", p
    guard = resolve_parameters(rendered["States"]["InitGuard"]["Parameters"], {"plan": p})
    payload = resolve_parameters(rendered["States"]["CostGuard"]["Parameters"],
                                 {"plan": p, "guard": guard})
    longest = Guard.from_json({**guard, "sentinel_name": guard_rules.sentinel_name(Plan.from_json(p),
                                                                                   guard_rules.SENTINEL_MAX),
                               "sentinel_max_runtime_seconds": MAX_RUNTIME_LIMIT_S,
                               "sentinel_max_wait_seconds": MAX_RUNTIME_LIMIT_S})
    request = launch.training_job_request(guard_rules.sentinel_request(payload["sentinel_request"], longest))
    assert launch.run_of(request) == run["name"]
    problems = request_problems(request, "sagemaker", "CreateTrainingJob")
    prose_rules("CreateTrainingJob", request, problems)
    assert problems == [], problems
    assert len(request["TrainingJobName"]) == 63 and request["EnableManagedSpotTraining"] is True
    assert request["ResourceConfig"] == p["resource_config_spot"]
    assert not {"InputDataConfig", "CheckpointConfig", "HyperParameters"} & set(request)
    assert {"Key": EXECUTION_TAG, "Value": "exec-sentinel"} in request["Tags"]


def test_every_plan_and_guard_path_exists_in_what_the_handlers_return(synth, rendered):
    text = json.dumps(rendered)
    plan_fields = set(re.findall(r"\$\.plan\.(\w+)", text))
    guard_paths = set(re.findall(r"\$\.guard\.(\w+)(?:\.(\w+))?", text))
    assert plan_fields <= PLAN_FIELDS | REFUSAL_FIELDS and {g for g, _ in guard_paths} <= GUARD_FIELDS
    assert {sub for g, sub in guard_paths if g == "report" and sub} <= REPORT_FIELDS
    states = states_for_every_branch(synth, rendered)
    p = states[0][1]["plan"]
    refused = [s["plan"] for b, s in states if b in ("over budget", "invalid run")]
    # The real estimate returns every field the definition reads, in its ok or its refusal form.
    assert plan_fields - REFUSAL_FIELDS <= set(p)
    assert all(plan_fields & REFUSAL_FIELDS <= set(r) for r in refused)
    done = next(s["guard"] for b, s in states if b == "spot: register")
    for field, sub in guard_paths:
        assert field in done and (not sub or sub in done[field]), (field, sub)


def test_the_plans_hyperparameters_parse_into_the_trainers_config(synth, rendered):
    p = states_for_every_branch(synth, rendered)[0][1]["plan"]
    config = job_config(  # with the overrides the launcher adds on SageMaker
        p["hyperparameters"], **{"data.path": "/opt/ml/input/data/train", "output_dir": "/opt/ml/model",
                                 "checkpoint.dir": "/opt/ml/checkpoints",
                                 "data.validation_path": "/opt/ml/input/data/validation"})
    assert config.data.seq_len == RUN["data"]["seq_len"]
    assert (config.eval.every_steps, config.eval.max_batches, config.eval.keep_best) == (50, 20, True)
    assert config.export.from_ == "best"
    assert config.checkpoint.interval_s == p["estimate"]["checkpoint_interval_s"]
    # The segment's budget: the trainer saves and exits before the job's MaxRuntime.
    assert 0 < config.segment_seconds < p["max_runtime_seconds"]


def _cycle(definition: dict, start: str, back: str) -> list[str]:
    """States from `start` until the Choice sends the run back to `start` with action `back`."""
    names, name = [], start
    while True:
        names.append(name)
        state = definition["States"][name]
        if state["Type"] == "Choice":
            nxt = next(c["Next"] for c in state["Choices"] if c.get("StringEquals") == back)
            assert nxt == start
            return names
        name = state["Next"]


def test_the_longest_run_the_contract_allows_stays_under_half_the_history_quota(synth, rendered):
    loop = _cycle(rendered, "WaitForJob", "wait")
    per_poll = sum(EVENTS[rendered["States"][n]["Type"]] for n in loop)
    assert per_poll == 9, loop  # Wait + CostGuard + NextAction
    p = states_for_every_branch(synth, rendered)[0][1]["plan"]
    p = {**p, "max_usd": 1e9}  # a cap that never shortens the waits: the most polls
    polls = 0
    # MaxWait at the contract's maximum (56 days of spot), then a 28-day on-demand fallback.
    for job_seconds in (2 * MAX_RUNTIME_LIMIT_S, MAX_RUNTIME_LIMIT_S):
        age = 0.0
        while age < job_seconds:
            age += next_wait(p, age, 0.0)
            polls += 1
    stops_and_creates = 2 * 5 + 2 * (5 + EVENTS["Wait"])  # a stop each, the fallback create; generous
    fixed = sum(EVENTS[s["Type"]] for s in rendered["States"].values())  # every other state once, generously
    total = polls * per_poll + stops_and_creates + fixed
    assert total < HISTORY_QUOTA / 2, (polls, total)
    assert rendered["TimeoutSeconds"] >= 3 * MAX_RUNTIME_LIMIT_S  # the execution outlives its longest job


def test_an_execution_name_that_is_no_tag_value_is_refused_by_name(synth):
    refused = plan(copy.deepcopy(RUN), "retrain(2)", settings(synth))  # Step Functions accepts this name
    assert refused["status"] == "InvalidRun" and refused["field"] == "execution"
    assert "retrain(2)" in refused["message"] and "retrain-2" in refused["message"]


def test_registry_metadata_keeps_the_exact_data_source_as_a_digest(synth, rendered):
    done = next(s["guard"] for b, s in states_for_every_branch(synth, rendered) if b == "on-demand: register")
    meta = done["report"]["metadata"]
    source = done["report"]["data_source"]
    assert len(source) > 256 and len(meta["data_source"]) == 256 and meta["data_source"].endswith("...")
    assert meta["data_source_sha256"] == hashlib.sha256(source.encode()).hexdigest()
    assert meta["price_region"] == "us-east-1" and meta["cost_basis"]


def test_every_functions_synthesized_environment_is_what_its_handler_decodes(synth):
    """The construct writes each function's environment with the seam's `to_env`; the handler reads it back with
    `from_env` at its entry point: every variable the stack sets decodes, and nothing the handler ignores is set."""
    from spotrun.seams import (
        CancelEnvironment,
        CostGuardEnvironment,
        LaunchEnvironment,
        PipelineSettings,
        PreparationSettings,
        PrepareEnvironment,
        RecorderEnvironment,
    )
    from tests.infra.render import placeholder

    readers = {"spotrun.handlers.estimate.handler": (PipelineSettings, PreparationSettings),
               "spotrun.handlers.cost_guard.handler": (CostGuardEnvironment,),
               "spotrun.handlers.cancel.handler": (CancelEnvironment,),
               "spotrun.handlers.interruptions.handler": (RecorderEnvironment,),
               "spotrun.handlers.prepare.handler": (PrepareEnvironment,),
               "spotrun.handlers.launch.handler": (LaunchEnvironment,)}
    seen = set()
    for fn in synth.resources("AWS::Lambda::Function").values():
        handler = fn["Properties"].get("Handler", "")
        if handler not in readers:
            continue
        seen.add(handler)
        env = {k: render(v, placeholder) for k, v in fn["Properties"]["Environment"]["Variables"].items()}
        assert {k: v for reader in readers[handler] for k, v in reader.from_env(env).to_env().items()} == env, handler
    assert seen == readers.keys()
    with pytest.raises(ValueError, match=r"POLL_SECONDS='soon' of PipelineSettings is invalid: expected an integer"):
        PipelineSettings.from_env({"BUCKET_NAME": "b", "JOB_PREFIX": "p-", "MODEL_PACKAGE_GROUP": "g",
                                   "POLL_SECONDS": "soon"})
    with pytest.raises(ValueError, match="JOB_PREFIX is missing: CancelEnvironment needs it"):
        CancelEnvironment.from_env({})


def test_a_run_naming_a_sagemaker_mlflow_server_sends_mlflow_config_and_others_send_none(synth, rendered):
    """SageMaker's own MLflow integration: the tracked creates carry the plan's MlflowConfig (valid for botocore's
    model, checked above on every branch), the untracked ones carry no MlflowConfig key at all."""
    states = dict(states_for_every_branch(synth, rendered))
    for branch, name in (("tracked spot: first create", "CreateSpotTrainingJobTracked"),
                         ("tracked on-demand: first create", "CreateOnDemandTrainingJobTracked")):
        state = states[branch]
        params = resolve_parameters(rendered["States"][name]["Parameters"], state)
        assert params["MlflowConfig"] == {"MlflowResourceArn": MLFLOW_ARN, "MlflowExperimentName": "support bot v2",
                                          "MlflowRunName": state["plan"]["execution"]}
        # The container's own logger writes to the same experiment (spotrun_trainer/tracking.py).
        assert state["plan"]["hyperparameters"]["tracking.experiment"] == "support bot v2"
    for name in ("CreateSpotTrainingJob", "CreateOnDemandTrainingJob"):
        assert "MlflowConfig" not in rendered["States"][name]["Parameters"]
        assert not any(k.startswith("MlflowConfig") for k in rendered["States"][name]["Parameters"])
    assert states["spot: first create"]["plan"]["mlflow_config"] == {}
