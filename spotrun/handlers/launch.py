"""Launch Lambda: creates a training job with credentials tagged with its run (spotrun/pipeline/launch.py).

The state machine passes the CreateTrainingJob request it built (training_constructs/training_pipeline.py
`create_training_job_parameters`); this function assumes the launcher role with the session tag run=<run> and
creates the job with SageMaker's session tag chaining, so the job's credentials reach only that run's data.
Environment (read here, at the entry point): spotrun.seams.LaunchEnvironment.
"""

from __future__ import annotations

import os
from typing import Any

from ..contract.strict_json import strict
from ..pipeline.launch import launch
from ..seams import LaunchEnvironment


def handler(event: dict, _context: Any) -> dict:
    import boto3  # in the Lambda runtime; imported here so that importing the module needs no AWS SDK

    env = LaunchEnvironment.from_env(os.environ)
    return strict(launch(boto3.client("sts"), lambda credentials: boto3.client("sagemaker", **credentials),
                         env.launcher_role_arn, event))  # strict JSON: a non-finite figure fails here
