"""Which job role may touch which data, decided by evaluators we did not write: moto's IAM authorization and
@cloud-copilot/iam-simulate (tests/infra/iam_simulate.py).

Every IAM policy the synthesized template attaches to a role is rendered (bucket ARN in place of its Fn::GetAtt).
The preparation role's policies become that role's inline policies in moto's IAM; the test assumes the role through
STS and makes the S3 requests a preparation job makes with the session's credentials, with moto's authorization on
(`settings.INITIAL_NO_AUTH_ACTION_COUNT`, what moto's `set_initial_no_auth_action_count` sets: the setup calls
before it run unauthenticated). The role trusts sagemaker.amazonaws.com in the template; here it trusts the test's
user, the one principal moto can assume it as.
moto decides on Action and Resource only: it substitutes no policy variables and gives S3 requests no condition
context (moto/iam/access_control.py). The training role's grants are per run (`${aws:PrincipalTag/run}`, the
session tag SageMaker chains from the launch function's session), so its requests, and the launcher role's trust,
are decided by iam-simulate, which evaluates policy variables, condition keys and trust policies.
"""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws, settings
from moto.core.authorization import ActionAuthenticatorMixin

from spotrun.seams import HUB_MODELS_PREFIX, PREPARED_PREFIX, RUN_TAG
from tests.infra.iam_simulate import Request, decide
from tests.infra.render import placeholder, render

BUCKET, ACCOUNT = "spotrun-artifacts", "123456789012"
USER_ARN = f"arn:aws:iam::{ACCOUNT}:user/tester"
# What already lies in the bucket: another run's registered model, a prepared dataset later runs reuse, a user's
# dataset and model, this execution's tokenizer manifest and another run's checkpoint.
SEEDED = ("output/other-run-job/output/model.tar.gz", f"{PREPARED_PREFIX}0123abcd/shard-00000.bin",
          "datasets/alpaca/index.json", "models/llama/config.json",
          "checkpoints/run-a/exec-1/preparation/tokenizer.manifest", "checkpoints/other-run/exec-9/step-10/x.distcp")


def _rendered(value, resolve):
    """`value` (a policy document) with every Ref/Fn::GetAtt/Fn::Join rendered by `resolve`."""
    if isinstance(value, list):
        return [_rendered(v, resolve) for v in value]
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("Ref", "Fn::GetAtt", "Fn::Join"):
        return render(value, resolve)
    if isinstance(value, dict):
        return {k: _rendered(v, resolve) for k, v in value.items()}
    return value


def _role_policies(template: dict, prefix: str) -> tuple[str, list[dict]]:
    """The role whose logical ID starts with `prefix`, and every policy document attached to it, rendered."""
    (role_id,) = [lid for lid, r in template["Resources"].items()
                  if r["Type"] == "AWS::IAM::Role" and lid.startswith(prefix)]

    def resolve(logical_id: str, attribute: str | None) -> str:
        if logical_id.startswith("ArtifactsBucket") and attribute == "Arn":
            return f"arn:aws:s3:::{BUCKET}"
        if template["Resources"][logical_id]["Type"] == "AWS::IAM::Role":
            return f"arn:aws:iam::{ACCOUNT}:role/{logical_id}"
        return placeholder(logical_id, attribute)

    docs = [_rendered(r["Properties"]["PolicyDocument"], resolve) for r in template["Resources"].values()
            if r["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in r["Properties"]["Roles"]]
    assert docs, f"no policy is attached to {role_id}"
    return role_id, docs


def _setup(template: dict) -> tuple[list, dict[str, str]]:
    """The unauthenticated setup calls, in order: bucket and seeded objects, a user that may assume the roles, the
    job roles with the template's policies. Returns them and each role's name by its construct's ID."""
    s3, iam = boto3.client("s3"), boto3.client("iam")
    trust = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"AWS": USER_ARN}}]})
    may_assume = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}]})
    calls = [lambda: s3.create_bucket(Bucket=BUCKET), lambda: iam.create_user(UserName="tester"),
             lambda: iam.put_user_policy(UserName="tester", PolicyName="assume", PolicyDocument=may_assume)]
    calls += [lambda k=k: s3.put_object(Bucket=BUCKET, Key=k, Body=b"seeded") for k in SEEDED]
    roles = {}
    for prefix in ("PreparationRole", "HubFetchRole"):
        role_id, docs = _role_policies(template, prefix)
        roles[prefix] = role_id
        calls.append(lambda r=role_id: iam.create_role(RoleName=r, AssumeRolePolicyDocument=trust))
        calls += [lambda r=role_id, i=i, d=d: iam.put_role_policy(RoleName=r, PolicyName=f"policy-{i}",
                                                                   PolicyDocument=json.dumps(d))
                  for i, d in enumerate(docs)]
    return calls, roles


@pytest.fixture
def s3_as(synth, monkeypatch):
    """S3 clients holding each role's session credentials, moto's IAM authorization deciding every request."""
    with mock_aws():
        calls, roles = _setup(synth.template)
        key: dict = {}
        calls.append(lambda: key.update(boto3.client("iam").create_access_key(UserName="tester")["AccessKey"]))
        monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", len(calls))
        monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)
        for call in calls:
            call()
        sts = boto3.client("sts", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
        clients = {}
        for prefix, role in roles.items():
            creds = sts.assume_role(RoleArn=f"arn:aws:iam::{ACCOUNT}:role/{role}", RoleSessionName="job")
            c = creds["Credentials"]
            clients[prefix] = boto3.client("s3", aws_access_key_id=c["AccessKeyId"],
                                           aws_secret_access_key=c["SecretAccessKey"],
                                           aws_session_token=c["SessionToken"])
        yield clients


def _allowed(request) -> bool:
    try:
        request()
    except ClientError as e:
        assert e.response["Error"]["Code"] == "AccessDenied", e.response["Error"]
        return False
    return True


def _put(client, key: str):
    return lambda: client.put_object(Bucket=BUCKET, Key=key, Body=b"written")


def _get(client, key: str):
    return lambda: client.get_object(Bucket=BUCKET, Key=key)


def _delete(client, key: str):
    return lambda: client.delete_object(Bucket=BUCKET, Key=key)


def _s3(key: str) -> str:
    return f"arn:aws:s3:::{BUCKET}/{key}"


def _as_run(run: str | None, action: str, resource: str, **context) -> Request:
    """A request by a training job whose credentials carry the session tag run=`run` (None: no tag)."""
    tags = {} if run is None else {f"aws:PrincipalTag/{RUN_TAG}": run}
    return Request(action, resource, context={**tags, **context})


# What a training job of run-a does: reads its data and model, lists, writes, reads and prunes its checkpoints,
# uploads its artifact under output/run-a/ (S3OutputPath).
RUN_A_JOB = [
    _as_run("run-a", "s3:GetObject", _s3("datasets/alpaca/index.json")),
    _as_run("run-a", "s3:GetObject", _s3("models/llama/config.json")),
    _as_run("run-a", "s3:ListBucket", f"arn:aws:s3:::{BUCKET}", **{"s3:prefix": "checkpoints/run-a/exec-1/"}),
    _as_run("run-a", "s3:PutObject", _s3("checkpoints/run-a/exec-1/step-20/x.distcp")),
    _as_run("run-a", "s3:GetObject", _s3("checkpoints/run-a/exec-1/step-20/x.distcp")),
    _as_run("run-a", "s3:DeleteObject", _s3("checkpoints/run-a/exec-1/step-20/x.distcp")),
    _as_run("run-a", "s3:PutObject", _s3("output/run-a/spotrun-run-a-1a2b-s1/output/model.tar.gz")),
]
# What it must not: another run's artifact and checkpoints (run-ab shares run-a's first characters), prepared
# data later runs reuse, every user's dataset and model, reading or deleting any registered model; and a job
# whose credentials carry no run tag reaches no checkpoint and no output at all.
DENIED = [
    _as_run("run-a", "s3:PutObject", _s3("output/run-b/spotrun-run-b-9f9f-s1/output/model.tar.gz")),
    _as_run("run-a", "s3:PutObject", _s3("output/run-ab/spotrun-run-ab-9f9f-s1/output/model.tar.gz")),
    _as_run("run-a", "s3:PutObject", _s3("output/model.tar.gz")),
    _as_run("run-a", "s3:GetObject", _s3("output/run-a/spotrun-run-a-1a2b-s1/output/model.tar.gz")),
    _as_run("run-a", "s3:DeleteObject", _s3("output/run-b/spotrun-run-b-9f9f-s1/output/model.tar.gz")),
    _as_run("run-a", "s3:PutObject", _s3("checkpoints/run-b/exec-9/step-10/x.distcp")),
    _as_run("run-a", "s3:GetObject", _s3("checkpoints/run-b/exec-9/step-10/x.distcp")),
    _as_run("run-a", "s3:DeleteObject", _s3("checkpoints/run-ab/exec-9/step-10/x.distcp")),
    _as_run("run-a", "s3:ListBucket", f"arn:aws:s3:::{BUCKET}", **{"s3:prefix": "checkpoints/run-b/"}),
    _as_run("run-a", "s3:PutObject", _s3(f"{PREPARED_PREFIX}0123abcd/shard-00000.bin")),
    _as_run("run-a", "s3:PutObject", _s3("datasets/alpaca/index.json")),
    _as_run("run-a", "s3:PutObject", _s3("models/llama/config.json")),
    _as_run("run-a", "s3:DeleteObject", _s3("models/llama/config.json")),
    _as_run(None, "s3:PutObject", _s3("checkpoints/run-a/exec-1/step-20/x.distcp")),
    _as_run(None, "s3:GetObject", _s3("checkpoints/run-a/exec-1/step-20/x.distcp")),
    _as_run(None, "s3:PutObject", _s3("output/run-a/spotrun-run-a-1a2b-s1/output/model.tar.gz")),
]


def test_a_training_job_touches_only_its_own_runs_checkpoints_and_output(synth):
    _, policies = _role_policies(synth.template, "ExecutionRole")
    decisions = decide(policies, RUN_A_JOB + DENIED)
    allowed = dict(zip(map(repr, RUN_A_JOB + DENIED), decisions, strict=True))
    assert [allowed[repr(r)] for r in RUN_A_JOB] == ["Allowed"] * len(RUN_A_JOB), allowed
    assert [r for r in DENIED if allowed[repr(r)] == "Allowed"] == []


@pytest.mark.parametrize("creator", ["PipelineLauncherFnRole", "PipelineCostGuardFnRole"])
def test_only_the_launch_and_cost_guard_functions_assume_the_launcher_and_only_as_one_run(synth, creator):
    """The launcher role's trust (its resource policy) and the creating function's role policy (the launch
    function, or the cost guard creating a sentinel): AssumeRole and TagSession with run=<run> and no other tag;
    no tag, another tag, or another principal is refused."""
    resources = synth.template["Resources"]
    launcher, _ = _role_policies(synth.template, "PipelineLauncherRole")
    fn_role, fn_policies = _role_policies(synth.template, creator)
    trust = _rendered(resources[launcher]["Properties"]["AssumeRolePolicyDocument"],
                      lambda lid, attr: f"arn:aws:iam::{ACCOUNT}:role/{lid}")
    role_arn, fn_arn = f"arn:aws:iam::{ACCOUNT}:role/{launcher}", f"arn:aws:iam::{ACCOUNT}:role/{fn_role}"
    fn_policies = [_rendered(d, lambda lid, attr: f"arn:aws:iam::{ACCOUNT}:role/{lid}") for d in fn_policies]
    as_run = {f"aws:RequestTag/{RUN_TAG}": "run-a", "aws:TagKeys": [RUN_TAG]}
    requests = [Request(action, role_arn, principal=fn_arn, context=context) for action, context in (
        ("sts:AssumeRole", as_run), ("sts:TagSession", as_run),
        ("sts:AssumeRole", {}),
        ("sts:TagSession", {f"aws:RequestTag/{RUN_TAG}": "run-a", "aws:RequestTag/team": "x",
                            "aws:TagKeys": [RUN_TAG, "team"]}))]
    other = Request("sts:AssumeRole", role_arn, principal=f"arn:aws:iam::{ACCOUNT}:role/someone", context=as_run)
    assert decide(fn_policies, requests, trust) == ["Allowed", "Allowed", "ImplicitlyDenied", "ImplicitlyDenied"]
    assert decide([{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:*",
                                                             "Resource": "*"}]}], [other], trust) != ["Allowed"]


def test_only_the_preparation_job_adds_prepared_parts_and_it_touches_nothing_else(s3_as):
    prep = s3_as["PreparationRole"]
    # What a preparation job does: reads the raw text, the tokenizer and its manifest, uploads its parts.
    assert _allowed(_get(prep, "datasets/alpaca/index.json")) and _allowed(_get(prep, "models/llama/config.json"))
    assert _allowed(_get(prep, "checkpoints/run-a/exec-1/preparation/tokenizer.manifest"))
    assert _allowed(_put(prep, f"{PREPARED_PREFIX}4567cdef/part-0/shard-00000.bin"))
    # Nothing else: no checkpoint, no artifact, no user dataset, no delete of prepared data.
    assert not _allowed(_get(prep, "checkpoints/other-run/exec-9/step-10/x.distcp"))
    assert not _allowed(_put(prep, "checkpoints/run-a/exec-1/step-20/x.distcp"))
    assert not _allowed(_put(prep, "output/other-run-job/output/model.tar.gz"))
    assert not _allowed(_get(prep, "output/other-run-job/output/model.tar.gz"))
    assert not _allowed(_put(prep, "datasets/alpaca/index.json"))
    assert not _allowed(_delete(prep, f"{PREPARED_PREFIX}0123abcd/shard-00000.bin"))


def test_the_hub_fetch_job_the_one_with_network_only_adds_files_under_models_hub(s3_as):
    fetch = s3_as["HubFetchRole"]
    assert _allowed(_put(fetch, f"{HUB_MODELS_PREFIX}org/name/main/model.safetensors"))
    # It reads nothing (a job with network holds no data worth taking), overwrites no user's model, deletes nothing.
    for key in ("models/llama/config.json", "datasets/alpaca/index.json", f"{PREPARED_PREFIX}0123abcd/shard-00000.bin",
                "output/other-run-job/output/model.tar.gz", f"{HUB_MODELS_PREFIX}org/name/main/model.safetensors"):
        assert not _allowed(_get(fetch, key)), key
    assert not _allowed(_put(fetch, "models/llama/config.json"))
    assert not _allowed(_put(fetch, "datasets/alpaca/index.json"))
    assert not _allowed(_delete(fetch, f"{HUB_MODELS_PREFIX}org/name/main/model.safetensors"))
