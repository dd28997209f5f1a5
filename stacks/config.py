"""Per-account configuration: the one module a fork edits.

Each entry of `ENVIRONMENTS` becomes a Stage (`python app.py` synthesizes all of them; `cdk deploy
'<stage>/*'` deploys one). Nothing below app.py reads the environment: every value comes from here.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

from spotrun.contract.aws_text import TAG_KEY_MAX, TAG_VALUE_MAX, aws_text_ok
from spotrun.contract.strict_json import RunValidationError
from spotrun.contract.values import mlflow_uri
from spotrun.planner.estimate import load_catalog

# Patterns of the AWS APIs these values end up in (EC2 ids; SageMaker ModelPackageGroupName).
SUBNET_ID = re.compile(r"^subnet-[0-9a-f]{8}(?:[0-9a-f]{9})?$")
SECURITY_GROUP_ID = re.compile(r"^sg-[0-9a-f]{8}(?:[0-9a-f]{9})?$")
# A Secrets Manager secret's ARN (no comma: the estimate function's environment lists them comma-separated).
WANDB_SECRET_ARN = re.compile(r"arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]{1,512}")
GROUP_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
GROUP_SUFFIX_LEN = 9  # "-" + 8 characters of the stack's id: a redeploy after destroy gets a fresh group
MAX_GROUP_NAME = 63
MAX_JOB_PREFIX = 24  # job names are <= 63: prefix + run name + execution hash + the fallback's "-od"


@dataclass(frozen=True)
class AccountConfig:
    """One deployment target."""

    stage: str
    """Stage name; prefixes stack names and training job names (`spotrun-<stage>-...`)."""
    account: str | None
    """12-digit account id; None synthesizes environment-agnostic (fine for synth/tests, not for deploy)."""
    region: str
    """Must be a region spotrun/planner/catalog.json has SageMaker prices for (the estimate prices runs there)."""
    cost_center: str
    """Value of the cost-center cost-allocation tag on every resource and training job."""
    monthly_budget_usd: float
    """AWS Budgets monthly cost budget on the project's tag; alerts at 80% actual and 100% forecast."""
    notification_emails: tuple[str, ...] = ()
    """Subscribed to the failures topic and the budget alerts (none: a warning, nobody hears of failures)."""
    model_package_group: str | None = None
    """Model Registry group name base (None: `<project>-<stage>-models`); the stack appends a suffix unique to
    the stack instance, so two stages, or a redeploy after destroy (the group is retained), never collide."""
    vpc_subnet_ids: tuple[str, ...] = ()
    """Optional: run training jobs in these subnets (with `security_group_ids`)."""
    security_group_ids: tuple[str, ...] = ()
    checkpoint_retention_days: int = 30
    """Objects under checkpoints/ expire after this many days (a finished run needs none of them)."""
    allowed_instance_types: tuple[str, ...] = ()
    """Instance types runs of this stage may use (empty: every type of the catalog); the estimate refuses others."""
    trainer_base_image: str | None = None
    """Base image for the trainer; None: the SageMaker PyTorch training image of the region."""
    inference_image: str | None = None
    """Serving image recorded in model packages; None: the SageMaker HF LLM (TGI) image of the region."""
    max_usd_per_run: float = 5000.0
    """The largest `budget.max_usd` a run of this stage may ask for (the estimate refuses more)."""
    max_instances_per_run: int = 16
    """The most instances one run may use (an explicit `compute.instance_count` above it is refused; `auto`
    chooses within it)."""
    max_concurrent_runs: int = 4
    """Executions of this stage's pipeline that may run at once (the estimate of one more is refused)."""
    mlflow_tracking_servers: tuple[str, ...] = ()
    """The MLflow tracking servers runs of this stage may log to (a run's `tracking.mlflow_uri`): SageMaker AI MLflow
    tracking server ARNs (the training role gets the sagemaker-mlflow actions the trainer's tracker calls, on
    these servers only) and/or https URLs. Empty: no tracking, no MLflow permission."""
    wandb_api_key_secrets: tuple[str, ...] = ()
    """The AWS Secrets Manager secrets (full ARNs) holding Weights & Biases API keys that runs of this stage may name
    (a run's `tracking.wandb_api_key_secret`): the training role may read these secrets only, and a run naming one
    trains without network isolation (it reaches W&B). Empty: no W&B."""
    prepare_instance_type: str = "ml.m5.xlarge"
    """CPU instance type of the preparation job that tokenizes a raw `data.source` (SageMaker Processing); must be
    priced in spotrun/planner/catalog.json's `processing_usd_per_hour` for the region."""
    prepare_instance_count: int = 2
    """Instances the raw files are sharded across (ShardedByS3Key; fewer when there are fewer files)."""
    prepare_max_hours: float = 24.0
    """The preparation job's MaxRuntime (it is also never more than the run's cap buys at the processing rate)."""
    project: str = "spotrun"
    extra_tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_types()
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,15}", self.stage):
            raise ValueError(f"stage={self.stage!r} is invalid: expected 1-16 lowercase letters, digits, hyphens")
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,15}", self.project):
            raise ValueError(f"project={self.project!r} is invalid: expected 1-16 lowercase letters, digits, hyphens")
        if len(self.job_prefix) > MAX_JOB_PREFIX:
            raise ValueError(f"stage={self.stage!r} is too long for project={self.project!r}: the job prefix "
                             f"{self.job_prefix!r} has {len(self.job_prefix)} characters, at most {MAX_JOB_PREFIX}")
        if self.account is not None and not re.fullmatch(r"\d{12}", self.account):
            raise ValueError(f"account={self.account!r} is invalid: expected a 12-digit AWS account id or None")
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", self.region):
            raise ValueError(f"region={self.region!r} is invalid: expected a region such as us-east-1")
        catalog = _catalog()
        if self.region not in catalog["regions"]:
            raise ValueError(f"region={self.region!r} has no SageMaker prices in spotrun/planner/catalog.json: "
                             f"expected one of {', '.join(sorted(catalog['regions']))}; run `spotrun catalog update "
                             f"--region {self.region}` to price it")
        for itype in self.allowed_instance_types:
            if itype not in catalog["regions"][self.region]["on_demand_usd_per_hour"]:
                raise ValueError(f"allowed_instance_types: {itype!r} is not priced in {self.region}: expected types "
                                 f"of spotrun/planner/catalog.json such as ml.g5.xlarge")
        if self.monthly_budget_usd <= 0:
            raise ValueError(f"monthly_budget_usd={self.monthly_budget_usd} is invalid: expected a positive amount")
        if bool(self.vpc_subnet_ids) != bool(self.security_group_ids):
            raise ValueError("vpc_subnet_ids and security_group_ids go together: set both (run in a VPC) or neither")
        for name, values, pattern, example in (("vpc_subnet_ids", self.vpc_subnet_ids, SUBNET_ID, "subnet-0abc1234"),
                                               ("security_group_ids", self.security_group_ids, SECURITY_GROUP_ID,
                                                "sg-0abc1234")):
            for value in values:
                if not pattern.match(value):
                    raise ValueError(f"{name}: {value!r} is invalid: expected an id such as {example} "
                                     "(8 or 17 hex digits)")
        group = self.model_package_group_base
        if not GROUP_NAME.match(group) or len(group) > MAX_GROUP_NAME - GROUP_SUFFIX_LEN:
            raise ValueError(f"model_package_group={group!r} is invalid: expected letters, digits and inner hyphens, "
                             f"at most {MAX_GROUP_NAME - GROUP_SUFFIX_LEN} characters (the stack appends "
                             f"{GROUP_SUFFIX_LEN})")
        for email in self.notification_emails:
            if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", email):
                raise ValueError(f"notification_emails: {email!r} is not an email address")
        if not self.notification_emails:
            warnings.warn(f"stage {self.stage}: no notification_emails: failed, cancelled and capped runs and budget "
                          "alerts reach nobody (subscribe to the failures topic yourself)", UserWarning, stacklevel=3)
        for key, value in {"cost_center": self.cost_center, **{f"extra_tags[{k!r}]": v
                                                                for k, v in self.extra_tags.items()}}.items():
            if not isinstance(value, str) or len(value) > TAG_VALUE_MAX or not aws_text_ok(value):
                raise ValueError(f"{key}={value!r} is invalid: expected a tag value of at most {TAG_VALUE_MAX} "
                                 "letters, digits, spaces or _.:/=+-@ (it tags every resource and training job)")
        for key in self.extra_tags:
            if not 1 <= len(key) <= TAG_KEY_MAX or not aws_text_ok(key):
                raise ValueError(f"extra_tags key {key!r} is invalid: expected 1-{TAG_KEY_MAX} letters, digits, "
                                 "spaces or _.:/=+-@")
        if not 0 < self.max_usd_per_run <= 10_000_000:
            raise ValueError(f"max_usd_per_run={self.max_usd_per_run} is invalid: expected 0 < USD <= 10,000,000")
        if not 1 <= self.max_instances_per_run <= 64:
            raise ValueError(f"max_instances_per_run={self.max_instances_per_run} is invalid: expected 1..64")
        if not 1 <= self.max_concurrent_runs <= 100:
            raise ValueError(f"max_concurrent_runs={self.max_concurrent_runs} is invalid: expected 1..100")
        for server in self.mlflow_tracking_servers:
            try:  # the run contract's own check of tracking.mlflow_uri: a stage lists what a run may name
                mlflow_uri(server, "mlflow_tracking_servers")
            except RunValidationError as exc:
                raise ValueError(str(exc)) from None
            if "," in server:
                raise ValueError(f"mlflow_tracking_servers: {server!r} is invalid: expected no comma (the estimate "
                                 "function's environment lists the servers comma-separated)")
        for secret in self.wandb_api_key_secrets:
            if not WANDB_SECRET_ARN.fullmatch(secret):
                raise ValueError(f"wandb_api_key_secrets: {secret!r} is invalid: expected a Secrets Manager secret's "
                                 "full ARN (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-SUFFIX)")
        if not 1 <= self.checkpoint_retention_days <= 3650:
            raise ValueError(f"checkpoint_retention_days={self.checkpoint_retention_days} is invalid: 1..3650")
        self._check_preparation(catalog)

    def _check_preparation(self, catalog: dict) -> None:
        priced = catalog["regions"][self.region].get("processing_usd_per_hour", {})
        if self.prepare_instance_type not in priced:
            raise ValueError(f"prepare_instance_type={self.prepare_instance_type!r} has no processing price in "
                             f"{self.region}: expected one of {', '.join(sorted(priced)) or 'none'} (spotrun/"
                             "catalog.json processing_usd_per_hour)")
        if isinstance(self.prepare_instance_count, bool) or not isinstance(self.prepare_instance_count, int) or \
                not 1 <= self.prepare_instance_count <= 100:
            raise ValueError(f"prepare_instance_count={self.prepare_instance_count!r} is invalid: expected 1..100 "
                             "(CreateProcessingJob's InstanceCount)")
        if isinstance(self.prepare_max_hours, bool) or not isinstance(self.prepare_max_hours, (int, float)) or \
                not 0.25 <= self.prepare_max_hours <= 216:
            raise ValueError(f"prepare_max_hours={self.prepare_max_hours!r} is invalid: expected 0.25..216 hours "
                             "(CreateProcessingJob's MaxRuntimeInSeconds is at most 777,600 s)")

    def _check_types(self) -> None:
        expected = {"stage": str, "region": str, "cost_center": str, "project": str,
                    "monthly_budget_usd": (int, float), "checkpoint_retention_days": int, "extra_tags": dict,
                    "max_usd_per_run": (int, float), "max_instances_per_run": int, "max_concurrent_runs": int}
        for name, kind in expected.items():
            value = getattr(self, name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"{name}={value!r} is invalid: expected {getattr(kind, '__name__', 'a number')}")
        for name in ("account", "model_package_group", "trainer_base_image", "inference_image"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}={value!r} is invalid: expected a string or None")
        for name in ("notification_emails", "vpc_subnet_ids", "security_group_ids", "allowed_instance_types",
                     "mlflow_tracking_servers", "wandb_api_key_secrets"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name}={value!r} is invalid: expected a tuple of strings")

    @property
    def job_prefix(self) -> str:
        """Training job names start with this; the interruption rules match on it."""
        return f"{self.project}-{self.stage}-"

    @property
    def mlflow_tracking_server_arns(self) -> tuple[str, ...]:
        """The SageMaker AI MLflow tracking servers among `mlflow_tracking_servers` (the training role's resources)."""
        return tuple(s for s in self.mlflow_tracking_servers if s.startswith("arn:"))

    @property
    def model_package_group_base(self) -> str:
        return self.model_package_group or f"{self.project}-{self.stage}-models"

    @property
    def tags(self) -> dict[str, str]:
        return {"project": self.project, "stage": self.stage, "cost-center": self.cost_center, **self.extra_tags}


def _catalog() -> dict:
    return load_catalog()


def check_environments(environments: tuple[AccountConfig, ...]) -> None:
    """Stages that would collide: the same name, or (in one account and region) job prefixes where one starts
    with the other (the stages' EventBridge rules would record each other's jobs) or the same registry group."""
    for i, a in enumerate(environments):
        for b in environments[i + 1:]:
            if a.stage == b.stage:
                raise ValueError(f"stage={a.stage!r} appears twice in ENVIRONMENTS: stage names must be unique")
            if (a.account, a.region) != (b.account, b.region):
                continue
            if a.job_prefix.startswith(b.job_prefix) or b.job_prefix.startswith(a.job_prefix):
                raise ValueError(f"stages {a.stage!r} and {b.stage!r} share {a.region}: job prefixes "
                                 f"{a.job_prefix!r} and {b.job_prefix!r} overlap (one starts with the other)")
            if a.model_package_group_base == b.model_package_group_base:
                raise ValueError(f"stages {a.stage!r} and {b.stage!r} share {a.region}: model_package_group "
                                 f"{a.model_package_group_base!r} is the same; give each its own")


ENVIRONMENTS: tuple[AccountConfig, ...] = (
    AccountConfig(
        stage="dev",
        account=None,  # fork: set your account id
        region="us-east-1",
        cost_center="ml-platform",
        monthly_budget_usd=2000,
        notification_emails=("ml-platform-alerts@example.com",),
    ),
)
check_environments(ENVIRONMENTS)
