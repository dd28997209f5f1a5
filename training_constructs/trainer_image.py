"""TrainerImage: the ECR image built from training_image/Dockerfile at deploy time (Docker needed then, not at synth).

The build context is the repository root, reduced to what the image installs (training_image/ and the
`spotrun` package, whose `spotrun.seams` the trainer imports): the same module the planner and the handlers use.
The base image is a build argument: by default the SageMaker PyTorch training image of the region (CUDA, NCCL,
EFA, libfabric, aws-ofi-nccl), looked up offline with the `sagemaker` package's image_uris; the serving image of
registered models is the region's HF LLM (TGI) image, looked up the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aws_cdk import aws_ecr_assets as ecr_assets
from constructs import Construct

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = "training_image/Dockerfile"
# Only these go into the build context (the root .dockerignore says the same for `docker build` by hand).
# spotrun/local (the laptop pipeline, demo and example builders) never runs in SageMaker: kept out of the image.
CONTEXT = ["*", "!pyproject.toml", "!spotrun", "!spotrun/**", "!training_image", "!training_image/**",
           "spotrun/local", "**/__pycache__", "**/*.pyc", "**/*.egg-info"]
# Newest PyTorch training DLC in the pinned sagemaker-core's offline catalog.
DLC_VERSIONS = {"training": ("2.10", "py313")}
# HF LLM (TGI) serving image: it serves a Hugging Face safetensors directory from /opt/ml/model.
TGI_VERSION = "3.3.6"


def sagemaker_image(region: str, scope: str = "training", instance_type: str = "ml.p5.48xlarge") -> str:
    """The SageMaker PyTorch DLC URI for a region, from the sagemaker package's offline catalog."""
    from sagemaker.core import image_uris  # sagemaker.core takes seconds to import: loaded only when a URI is asked for

    version, py_version = DLC_VERSIONS[scope]
    return image_uris.retrieve("pytorch", region, version=version, py_version=py_version,
                               image_scope=scope, instance_type=instance_type)


def serving_image(region: str) -> str:
    """The SageMaker HF LLM (TGI) inference image URI for a region, from the same offline catalog."""
    from sagemaker.core import image_uris  # sagemaker.core takes seconds to import (13 s on a loaded machine)

    return image_uris.retrieve("huggingface-llm", region, version=TGI_VERSION)


@dataclass(frozen=True)
class TrainerImageProps:
    base_image: str
    """The SageMaker PyTorch training image the trainer image builds on (`sagemaker_image(region)`)."""
    directory: Path = REPO_ROOT
    """The build context holding the Dockerfile. Default: training_image/ of this repository."""


class TrainerImage(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: TrainerImageProps) -> None:
        super().__init__(scope, id_)
        if not (props.directory / DOCKERFILE).is_file():
            raise ValueError(f"TrainerImage: {props.directory} has no {DOCKERFILE}")
        self.asset = ecr_assets.DockerImageAsset(
            self, "Asset", directory=str(props.directory), file=DOCKERFILE, platform=ecr_assets.Platform.LINUX_AMD64,
            build_args={"BASE_IMAGE": props.base_image}, exclude=CONTEXT,
        )
        self.image_uri = self.asset.image_uri
        self.repository = self.asset.repository
