"""Stage configuration (stacks/config.py): every bad value is refused at synth with the field, the value and what is
accepted; stages that would collide in one account and region are refused together."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from stacks.config import ENVIRONMENTS, AccountConfig, check_environments

BASE = dict(stage="dev", account="123456789012", region="us-east-1", cost_center="ml",
            monthly_budget_usd=100.0, notification_emails=("a@example.com",))


def config(**changes) -> AccountConfig:
    return AccountConfig(**{**BASE, **changes})


def test_the_shipped_environments_are_valid():
    check_environments(ENVIRONMENTS)
    assert all(c.job_prefix.endswith("-") for c in ENVIRONMENTS)


@pytest.mark.parametrize("changes, says", [
    (dict(stage="Dev"), "stage='Dev' is invalid"),
    (dict(stage="a-very-long-stage"), "stage='a-very-long-stage' is invalid"),
    (dict(project="spotrun-project", stage="staging-eu-1"), "job prefix 'spotrun-project-staging-eu-1-' has 29"),
    (dict(account="12345"), "account='12345' is invalid"),
    (dict(region="mars-1"), "region='mars-1' is invalid"),
    (dict(region="eu-west-3"), "region='eu-west-3' has no SageMaker prices"),
    (dict(monthly_budget_usd="100"), "monthly_budget_usd='100' is invalid"),
    (dict(monthly_budget_usd=True), "monthly_budget_usd=True is invalid"),
    (dict(monthly_budget_usd=0), "monthly_budget_usd=0 is invalid"),
    (dict(notification_emails=["a@example.com"]), "notification_emails=['a@example.com'] is invalid: expected a tuple"),
    (dict(notification_emails=("not-an-email",)), "'not-an-email' is not an email address"),
    (dict(vpc_subnet_ids=("subnet-0abc1234",)), "vpc_subnet_ids and security_group_ids go together"),
    (dict(vpc_subnet_ids=("subnet-xyz",), security_group_ids=("sg-0abc1234",)), "vpc_subnet_ids: 'subnet-xyz'"),
    (dict(vpc_subnet_ids=("subnet-0abc1234",), security_group_ids=("sg-12",)), "security_group_ids: 'sg-12'"),
    (dict(model_package_group="bad_name"), "model_package_group='bad_name' is invalid"),
    (dict(model_package_group="m" * 60), "at most 54 characters"),
    (dict(allowed_instance_types=("ml.t3.medium",)), "allowed_instance_types: 'ml.t3.medium' is not priced"),
    (dict(checkpoint_retention_days=0), "checkpoint_retention_days=0 is invalid"),
])
def test_bad_values_are_refused_by_name(changes, says):
    with pytest.raises(ValueError, match=None) as exc:
        config(**changes)
    assert says in str(exc.value)


def test_good_vpc_ids_and_allowed_types_are_accepted():
    c = config(vpc_subnet_ids=("subnet-0123456789abcdef0",), security_group_ids=("sg-0abc1234",),
               allowed_instance_types=("ml.g5.xlarge", "ml.p5.48xlarge"))
    assert c.model_package_group_base == "spotrun-dev-models"


def test_no_notification_emails_warns():
    with pytest.warns(UserWarning, match="stage dev: no notification_emails"):
        config(notification_emails=())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config()


def test_two_stages_in_one_account_and_region_may_not_collide():
    dev, prod = config(), config(stage="prod")
    check_environments((dev, prod))
    with pytest.raises(ValueError, match="stage='dev' appears twice"):
        check_environments((dev, dataclasses.replace(dev, region="us-east-1")))
    # spotrun-dev- is a prefix of spotrun-dev-x-: dev's rules would record the other stage's jobs.
    with pytest.raises(ValueError, match="job prefixes 'spotrun-dev-' and 'spotrun-dev-x-' overlap"):
        check_environments((dev, config(stage="dev-x")))
    with pytest.raises(ValueError, match="model_package_group 'shared' is the same"):
        check_environments((config(model_package_group="shared"), config(stage="prod", model_package_group="shared")))
    # In another account the same names are fine.
    check_environments((dev, config(stage="dev-x", account="210987654321")))
