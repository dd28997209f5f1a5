"""One set of rules for every run, two front ends: the estimate Lambda and `spotrun validate` / `estimate`.

The layers, in the order both apply them:

1. the contract (spotrun/contract.py): the run file itself and SageMaker's limits on what it sets;
2. the target's rules (`check_target`): sources under the stack's bucket prefixes, its model package group, the
   methods the pipeline runs, weights to train (a bare parameter count only estimates);
3. the sources (spotrun/sources.py): the model's config.json and the data's index.json;
4. the planner (spotrun/planner.py): fit, time limits, budget; then what the pipeline sends the trainer
   (`pipeline_hyperparameters`, within CreateTrainingJob's limits).

The CLI knows the target when told the stage (`--stage`: the stack's outputs) or offline (`--bucket`, `--group`);
without one it says that layer 2 was not checked. Exit codes: 0 ok, 2 invalid input, 3 refused by the planner.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contract import (
    HYPERPARAMETER_KEY_MAX,
    HYPERPARAMETER_VALUE_MAX,
    HYPERPARAMETERS_MAX,
    MAX_RUN_BYTES,
    RunSpec,
    RunValidationError,
    decode_run,
    parse_run,
)
from .planner import (
    DEFAULT_PRICE_REGION,
    Estimate,
    EstimateRefused,
    estimate,
    format_text,
    load_catalog,
    regional_catalog,
)
from .seams import METHODS, Hyperparameter, StackOutput, stack_name
from .simulate.choose import policy_text, spot_policy
from .sources import PLACEHOLDER_BUCKET, read_sources

EXIT_OK, EXIT_INVALID, EXIT_REFUSED = 0, 2, 3
EXIT_CODES_HELP = ("exit codes: 0 every run passed; 2 invalid input (the message names the field); 3 refused by "
                   "the planner (over budget, does not fit, needs more than SageMaker's 28-day MaxRuntime, ...)")
DATASETS_PREFIX, MODELS_PREFIX = "datasets/", "models/"  # the training role reads only these (ArtifactStore)
# A hyperparameter that carries a run field is reported as that field.
_HYPERPARAMETER_FIELDS = {Hyperparameter.MODEL_CONFIG.value: "model.config", Hyperparameter.LR.value: "training.lr",
                          Hyperparameter.EPOCHS.value: "training.epochs"}


@dataclass(frozen=True)
class Target:
    """The deployment a run is meant for: the stack's artifact bucket and model package group."""

    bucket: str
    model_package_group: str

    def describe(self) -> str:
        return (f"the stage's rules (sources under s3://{self.bucket}/{DATASETS_PREFIX} and {MODELS_PREFIX}, "
                f"model package group {self.model_package_group}, methods {'/'.join(METHODS)}, weights "
                "to train)")


def _require_under(uri: str | None, target: Target, prefix: str, field_path: str) -> str:
    wanted = f"s3://{target.bucket}/{prefix}"
    if not uri or not uri.startswith(wanted):
        hint = ""
        if uri and uri.startswith(f"s3://{PLACEHOLDER_BUCKET}/"):
            hint = f"; replace the placeholder {PLACEHOLDER_BUCKET} with the stack's ArtifactBucket output"
        raise RunValidationError(field_path, uri, f"an S3 URI under {wanted} (the training role reads only there)"
                                 + hint)
    return uri if uri.endswith("/") else uri + "/"


def check_target(run: RunSpec, target: Target) -> tuple[str, str | None]:
    """The pipeline's rules for one deployment; returns (data URI, model URI or None) as channels take them."""
    if run.model.parameters is not None:
        raise RunValidationError("model.parameters", run.model.parameters, 'model.source (pretrained weights) or '
                                 'model.config with model.init="random": training needs weights (a bare count only '
                                 "estimates)")
    if run.model.init is None:
        raise RunValidationError("model.init", None, '"random" to train the inline model.config from random weights '
                                 "(an explicit choice), or a model.source holding pretrained weights to fine-tune")
    if run.training.method not in METHODS:
        raise RunValidationError("training.method", run.training.method, " or ".join(METHODS))
    if run.model_package_group not in (None, target.model_package_group):
        raise RunValidationError("registry.model_package_group", run.model_package_group,
                                 f"{target.model_package_group} (this stack's group) or nothing")
    data_uri = _require_under(run.data.source, target, DATASETS_PREFIX, "data.source")
    model_uri = _require_under(run.model.source, target, MODELS_PREFIX, "model.source") if run.model.source else None
    return data_uri, model_uri


def validation_uri(run: RunSpec, target: Target) -> str | None:
    """data.validation as the `validation` channel takes it (under the datasets prefix), or None without it.
    A validation_fraction split travels inside the train channel (prepare's validation/ directory)."""
    if run.data.validation is None:
        return None
    return _require_under(run.data.validation, target, DATASETS_PREFIX, "data.validation")


def check_hyperparameters(hyper: dict[str, str]) -> None:
    """CreateTrainingJob's limits on HyperParameters (botocore's service model): count, key and value lengths."""
    if len(hyper) > HYPERPARAMETERS_MAX:
        raise RunValidationError("training", len(hyper), f"at most {HYPERPARAMETERS_MAX} hyperparameters")
    for key, value in hyper.items():
        where = _HYPERPARAMETER_FIELDS.get(key, f"hyperparameters.{key}")
        if not isinstance(value, str) or len(key) > HYPERPARAMETER_KEY_MAX or len(value) > HYPERPARAMETER_VALUE_MAX:
            raise RunValidationError(where, value, f"a hyperparameter string of at most {HYPERPARAMETER_VALUE_MAX:,} "
                                     f"characters (this one has {len(str(value)):,})")


def pipeline_hyperparameters(run: RunSpec, est: Estimate) -> dict[str, str]:
    """What the pipeline sends the trainer: the planner's hyperparameters, plus the inline config when the run
    trains from random weights (a pretrained model's config comes with its weights, in the model channel)."""
    hyper = dict(est.hyperparameters)
    if run.model.init == "random" and run.model.config is not None:
        hyper[Hyperparameter.MODEL_CONFIG.value] = json.dumps(run.model.config, separators=(",", ":"))
    check_hyperparameters(hyper)
    return hyper


# ---- the CLI front end ----------------------------------------------------------------------------------------


@dataclass
class Checked:
    """What one run file came to: the estimate (or None), and plainly what was checked and what was not."""

    run: RunSpec
    estimate: Estimate | None
    checked: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)


def check_file(path: Path, target: Target | None, *, plan: bool, s3_client: Any = None,
               region: str | None = None) -> Checked:
    """Every layer the CLI can apply to one run file; RunValidationError / EstimateRefused otherwise.
    `region`: whose on-demand prices the planner uses (DEFAULT_PRICE_REGION when None, and the output says so)."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_RUN_BYTES:
            raise RunValidationError("run", str(path), f"a file of at most {MAX_RUN_BYTES:,} bytes (Step Functions' "
                                     f"input limit); this one has {size:,}")
        data = Path(path).read_bytes()
    except (OSError, ValueError) as exc:
        raise RunValidationError("run", str(path), f"a readable file ({getattr(exc, 'strerror', None) or exc})"
                                 ) from None
    run = parse_run(decode_run(data, str(path)))
    out = Checked(run, None, checked=["the run contract and SageMaker's limits on it"])
    if target is not None:
        check_target(run, target)
        out.checked.append(target.describe())
    else:
        out.not_checked.append("the stage's rules (sources under its bucket's datasets/ and models/, its model "
                               "package group): give --stage, or --bucket and --group")
    if not plan:
        out.not_checked.append("the sources' config.json / index.json and the planner: run `spotrun estimate`")
        return out
    sources = read_sources(run, s3_client, offline=True)
    for note in sources.notes:
        if note.startswith("not "):
            out.not_checked.append(note.removeprefix("not checked: "))  # printed under "not checked:" already
        else:
            out.checked.append(note)
    if run.model.init is None and target is None:
        out.not_checked.append('training: a model.config without model.source or model.init="random" is a shape '
                               "for estimates only; the pipeline refuses to train it")
    catalog = load_catalog()
    priced_in = region or DEFAULT_PRICE_REGION
    catalog = regional_catalog(catalog, priced_in)
    out.estimate = estimate(run, catalog=catalog, model_config=sources.model_config, data_tokens=sources.tokens,
                            validation_tokens=sources.validation_tokens)
    pipeline_hyperparameters(run, out.estimate)
    out.estimate.spot_policy = spot_policy(run, out.estimate, catalog)
    out.checked.append("the planner (fit, MaxRuntime/MaxWait, budget) and the hyperparameters' limits")
    out.checked.append(f"costs at on-demand list prices in {priced_in} (spotrun catalog as of "
                       f"{catalog['regions'][priced_in].get('as_of', 'unknown')})"
                       + ("" if region else "; --region prices another region"))
    return out


def stage_target(stage: str, region: str | None, cfn_client: Any = None) -> Target:
    """The stage's bucket and group from its CloudFormation stack's outputs (stacks/spotrun_stack.py)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    stack = stack_name(stage)
    try:
        client = cfn_client or boto3.client("cloudformation", region_name=region)
        outputs = client.describe_stacks(StackName=stack)["Stacks"][0].get("Outputs", [])
    except (ClientError, BotoCoreError) as exc:
        raise RunValidationError("--stage", stage, f"a deployed stage whose stack {stack} can be read "
                                 f"({type(exc).__name__}); offline, give --bucket and --group") from None
    values = {o["OutputKey"]: o["OutputValue"] for o in outputs}
    bucket, group = StackOutput.ARTIFACT_BUCKET.value, StackOutput.MODEL_PACKAGE_GROUP_NAME.value
    if bucket not in values or group not in values:
        raise RunValidationError("--stage", stage, f"a stack {stack} with {bucket} and {group} outputs")
    return Target(values[bucket], values[group])


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", help="check against this deployed stage's rules (reads its stack's outputs)")
    parser.add_argument("--region", help="the stage's region (default: your AWS configuration's); `estimate` prices "
                        f"the run in it (default {DEFAULT_PRICE_REGION}; regions without prices in the catalog are "
                        "refused)")
    parser.add_argument("--bucket", help="offline: the stage's artifact bucket (its ArtifactBucket output)")
    parser.add_argument("--group", help="offline: the stage's model package group (ModelPackageGroupName output)")


def target_from_args(args: argparse.Namespace, cfn_client: Any = None) -> Target | None:
    if bool(args.bucket) != bool(args.group):
        given, missing = ("--bucket", "--group") if args.bucket else ("--group", "--bucket")
        raise RunValidationError(given, args.bucket or args.group, f"{missing} too (offline flags go together)")
    if args.bucket:
        return Target(args.bucket, args.group)
    if args.stage:
        return stage_target(args.stage, args.region, cfn_client)
    return None


def _error(exc: Exception) -> tuple[dict, int]:
    if isinstance(exc, EstimateRefused):
        out = {"error": exc.code, "field": exc.field or "run", "message": exc.message}
        if exc.estimate is not None:
            out["estimate"] = exc.estimate.to_json()
        return out, EXIT_REFUSED
    return {"error": "InvalidRun", "field": exc.field, "message": str(exc)}, EXIT_INVALID


def run_command(args: argparse.Namespace, *, plan: bool, cfn_client: Any = None, s3_client: Any = None) -> int:
    """`spotrun validate` (plan=False) and `spotrun estimate` (plan=True) over args.runs; returns the exit code."""
    try:
        target = target_from_args(args, cfn_client)
    except RunValidationError as exc:
        print(f"spotrun: {exc}", file=sys.stderr)
        return EXIT_INVALID
    status, docs = EXIT_OK, []
    for path in args.runs:
        try:
            checked = check_file(path, target, plan=plan, s3_client=s3_client, region=args.region)
            doc = {"status": "ok", **(checked.estimate.to_json() if checked.estimate else {}),
                   "checked": checked.checked, "not_checked": checked.not_checked}
        except (RunValidationError, EstimateRefused) as exc:
            doc, code = _error(exc)
            status = max(status, code)
            if args.format != "json":
                field_note = f"{doc['field']}: " if isinstance(exc, EstimateRefused) else ""
                print(f"{path}: {doc['error']}: {field_note}{doc['message']}", file=sys.stderr)
        docs.append({"file": str(path), **doc})
        if args.format != "json" and "error" not in doc:
            print(f"== {path}: ok")
            if checked.estimate is not None:
                print(format_text(checked.estimate))
                print(policy_text(checked.estimate.spot_policy))
            print("checked: " + "; ".join(checked.checked))
            if checked.not_checked:
                print("not checked: " + "; ".join(checked.not_checked))
    if args.format == "json":
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    return status


def register(sub: Any) -> None:
    """Add the `validate` and `estimate` subcommands to the CLI's subparsers."""
    val = sub.add_parser("validate", help="check run file(s) against every rule the pipeline applies",
                         description="Check run file(s): the contract, SageMaker's limits and, with --stage or "
                         "--bucket/--group, the stage's rules. " + EXIT_CODES_HELP, epilog=EXIT_CODES_HELP)
    est = sub.add_parser("estimate", help="estimate instance, time limits, checkpoint cadence and cost of run(s)",
                         description="Validate run file(s) as `validate` does, read their sources and plan them. "
                         + EXIT_CODES_HELP, epilog=EXIT_CODES_HELP)
    for parser, plan in ((val, False), (est, True)):
        parser.add_argument("runs", nargs="+", type=Path, help="run JSON file(s)")
        parser.add_argument("--format", choices=["text", "json"], default="text", help="text (default) or JSON")
        add_target_arguments(parser)
        parser.set_defaults(func=lambda args, plan=plan: run_command(args, plan=plan))
