"""Per-account configuration: the one module a fork edits.

Each entry of `ENVIRONMENTS` becomes a Stage (`python app.py` synthesizes all of them; `cdk deploy
'<stage>/*'` deploys one). Nothing below app.py reads the environment: every value comes from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AccountConfig:
    """One deployment target."""

    stage: str
    """Stage name; prefixes stack names and training job names (`spotrun-<stage>-...`)."""
    account: str | None
    """12-digit account id; None synthesizes environment-agnostic (fine for synth/tests, not for deploy)."""
    region: str
    cost_center: str
    """Value of the cost-center cost-allocation tag on every resource and training job."""
    monthly_budget_usd: float
    """AWS Budgets monthly cost budget on the project's tag; alerts at 80% actual and 100% forecast."""
    notification_emails: tuple[str, ...] = ()
    """Subscribed to the failures topic and the budget alerts."""
    model_package_group: str = "spotrun-models"
    """Model Registry group the pipeline registers into (created by the stack)."""
    vpc_subnet_ids: tuple[str, ...] = ()
    """Optional: run training jobs in these subnets (with `security_group_ids`)."""
    security_group_ids: tuple[str, ...] = ()
    checkpoint_retention_days: int = 30
    """Objects under checkpoints/ expire after this many days (a finished run needs none of them)."""
    trainer_base_image: str | None = None
    """Base image for the trainer; None: the SageMaker PyTorch training image of the region."""
    inference_image: str | None = None
    """Serving image recorded in model packages; None: the SageMaker PyTorch inference image of the region."""
    project: str = "spotrun"
    extra_tags: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,15}", self.stage):
            raise ValueError(f"stage={self.stage!r} is invalid: expected 1-16 lowercase letters, digits, hyphens")
        if self.account is not None and not re.fullmatch(r"\d{12}", self.account):
            raise ValueError(f"account={self.account!r} is invalid: expected a 12-digit AWS account id or None")
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", self.region):
            raise ValueError(f"region={self.region!r} is invalid: expected a region such as us-east-1")
        if self.monthly_budget_usd <= 0:
            raise ValueError(f"monthly_budget_usd={self.monthly_budget_usd} is invalid: expected a positive amount")
        if bool(self.vpc_subnet_ids) != bool(self.security_group_ids):
            raise ValueError("vpc_subnet_ids and security_group_ids go together: set both (run in a VPC) or neither")
        for email in self.notification_emails:
            if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", email):
                raise ValueError(f"notification_emails: {email!r} is not an email address")
        if not 1 <= self.checkpoint_retention_days <= 3650:
            raise ValueError(f"checkpoint_retention_days={self.checkpoint_retention_days} is invalid: 1..3650")

    @property
    def job_prefix(self) -> str:
        """Training job names start with this; the interruption rules match on it."""
        return f"{self.project}-{self.stage}-"

    @property
    def tags(self) -> dict[str, str]:
        return {"project": self.project, "stage": self.stage, "cost-center": self.cost_center, **self.extra_tags}


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
