"""One set of rules for every run, two front ends: the estimate Lambda and `spotrun validate` / `estimate`
(spotrun/cli/estimate.py, the CLI half).

The layers, in the order both apply them:

1. the contract (spotrun/contract/spec.py): the run file itself and SageMaker's limits on what it sets;
2. the target's rules (`check_target`): sources under the stack's bucket prefixes, its model package group, the
   methods the pipeline runs, weights to train (a bare parameter count only estimates);
3. the sources (spotrun/planner/sources.py): the model's config.json and the data's index.json;
4. the planner (spotrun/planner/estimate.py): fit, time limits, budget; then what the pipeline sends the trainer
   (its settings tree as hyperparameters, within CreateTrainingJob's limits: `check_hyperparameters`).

The CLI knows the target when told the stage (`--stage`: the stack's outputs) or offline (`--bucket`, `--group`);
without one it says that layer 2 was not checked. Exit codes: spotrun/cli/exits.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contract.hub_id import is_hub_id, parse_hub_id
from ..contract.spec import (
    HYPERPARAMETER_KEY_MAX,
    HYPERPARAMETER_VALUE_MAX,
    HYPERPARAMETERS_MAX,
    RunSpec,
    RunValidationError,
)
from ..planner.sources import PLACEHOLDER_BUCKET
from ..seams import METHODS
from .hub import hub_prefix

DATASETS_PREFIX, MODELS_PREFIX = "datasets/", "models/"  # the training role reads only these (ArtifactStore)


THIS_MACHINE = ""  # Target.bucket of `spotrun local`: its sources are paths on this machine, not S3 URIs


@dataclass(frozen=True)
class Target:
    """The deployment a run is meant for: the stack's artifact bucket and model package group (bucket
    THIS_MACHINE: `spotrun local`, whose sources are local paths)."""

    bucket: str
    model_package_group: str

    def describe(self) -> str:
        return (f"the stage's rules (sources under s3://{self.bucket}/{DATASETS_PREFIX} and {MODELS_PREFIX}, "
                f"model package group {self.model_package_group}, methods {'/'.join(METHODS)}, weights "
                "to train)")


def _require_under(uri: str | None, target: Target, prefix: str, field_path: str) -> str:
    if target.bucket == THIS_MACHINE:  # spotrun.local.pipeline.load_run checked that the path exists
        if not uri or uri.startswith("s3://"):
            raise RunValidationError(field_path, uri, "a local path for `spotrun local` (runs with s3:// sources "
                                     "start on AWS with `spotrun start`)")
        return uri
    wanted = f"s3://{target.bucket}/{prefix}"
    if not uri or not uri.startswith(wanted):
        hint = ""
        if uri and uri.startswith(f"s3://{PLACEHOLDER_BUCKET}/"):
            hint = f"; replace the placeholder {PLACEHOLDER_BUCKET} with the stack's ArtifactBucket output"
        raise RunValidationError(field_path, uri, f"an S3 URI under {wanted} (the training role reads only there)"
                                 + hint)
    return uri if uri.endswith("/") else uri + "/"


def hub_copy(source: str, target: Target) -> str:
    """A hub id's copy in the stage (spotrun/pipeline/hub.py: what the preparation step fetches it into); any
    other source as it is. `spotrun local` fetches before it plans: a hub id reaching here locally is refused."""
    if not is_hub_id(source):
        return source
    if target.bucket == THIS_MACHINE:
        raise RunValidationError("model.source", source, "a local model directory: `spotrun local` fetches a hub "
                                 "id into OUT/models/ before it plans (spotrun/local/pipeline.py)")
    return f"s3://{target.bucket}/{hub_prefix(parse_hub_id(source))}"


def check_catalog(run: RunSpec, catalog: dict) -> None:
    """compute.instance_type is `auto` or a type of spotrun's catalog (the planner knows no other)."""
    wanted = run.compute.instance_type
    if wanted != "auto" and wanted not in catalog["instances"]:
        raise RunValidationError("compute.instance_type", wanted, "auto or an instance type of spotrun's catalog: "
                                 + ", ".join(sorted(catalog["instances"])))


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
    model_uri = _require_under(hub_copy(run.model.source, target), target, MODELS_PREFIX, "model.source") \
        if run.model.source else None
    return data_uri, model_uri


def validation_uri(run: RunSpec, target: Target) -> str | None:
    """data.validation as the `validation` channel takes it (under the datasets prefix), or None without it.
    A validation_fraction split travels inside the train channel (prepare's validation/ directory)."""
    if run.data.validation is None:
        return None
    return _require_under(run.data.validation, target, DATASETS_PREFIX, "data.validation")


def check_hyperparameters(hyper: dict[str, str]) -> None:
    """CreateTrainingJob's limits on HyperParameters (botocore's service model): count, key and value lengths. A
    key is a dotted path of the settings tree, which is the run field's where both mean the same (model.config)."""
    if len(hyper) > HYPERPARAMETERS_MAX:
        raise RunValidationError("training", len(hyper), f"at most {HYPERPARAMETERS_MAX} hyperparameters")
    for key, value in hyper.items():
        if not isinstance(value, str) or len(key) > HYPERPARAMETER_KEY_MAX or len(value) > HYPERPARAMETER_VALUE_MAX:
            raise RunValidationError(key, value, f"a hyperparameter string of at most {HYPERPARAMETER_VALUE_MAX:,} "
                                     f"characters (this one has {len(str(value)):,})")
