"""The dev stage's pipeline settings the first-hour tests run the estimate Lambda and the CLI with (one copy)."""

from spotrun.pipeline.plan import PipelineSettings

BUCKET = "art-bucket"
SETTINGS = PipelineSettings(bucket=BUCKET, job_prefix="spotrun-dev-", model_package_group="spotrun-models",
                            poll_seconds=60, project="spotrun", stage="dev", cost_center="ml-platform")
