"""SpotrunStage: one deployment (account + region), tagged for cost allocation."""

from __future__ import annotations

from aws_cdk import Environment, Stage
from constructs import Construct

from spotrun.seams import STACK_ID
from training_constructs.cost_governance import apply_tags

from .config import AccountConfig
from .spotrun_stack import SpotrunStack


class SpotrunStage(Stage):
    def __init__(self, scope: Construct, id_: str, *, config: AccountConfig) -> None:
        super().__init__(scope, id_, env=Environment(account=config.account, region=config.region))
        self.stack = SpotrunStack(self, STACK_ID, config=config,
                                  description=f"{config.project} ({config.stage}): spot fine-tuning pipeline")
        apply_tags(self, config.tags)
