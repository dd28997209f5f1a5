"""TrainerImage: the ECR image built from training_image/ at deploy time (Docker needed then, not at synth).

The base image is a build argument: by default the SageMaker PyTorch training image of the region (CUDA, NCCL,
EFA, libfabric, aws-ofi-nccl), looked up offline with the `sagemaker` package's image_uris.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aws_cdk import aws_ecr_assets as ecr_assets
from constructs import Construct

TRAINING_IMAGE_DIR = Path(__file__).resolve().parent.parent / "training_image"
# Newest PyTorch DLC each scope has in the pinned sagemaker-core's offline catalog.
DLC_VERSIONS = {"training": ("2.10", "py313"), "inference": ("2.6", "py312")}


def sagemaker_image(region: str, scope: str = "training", instance_type: str = "ml.p5.48xlarge") -> str:
    """The SageMaker PyTorch DLC URI for a region, from the sagemaker package's offline catalog."""
    from sagemaker.core import image_uris

    version, py_version = DLC_VERSIONS[scope]
    return image_uris.retrieve("pytorch", region, version=version, py_version=py_version,
                               image_scope=scope, instance_type=instance_type)


@dataclass(frozen=True)
class TrainerImageProps:
    base_image: str
    directory: Path = TRAINING_IMAGE_DIR


class TrainerImage(Construct):
    def __init__(self, scope: Construct, id_: str, *, props: TrainerImageProps) -> None:
        super().__init__(scope, id_)
        if not (props.directory / "Dockerfile").is_file():
            raise ValueError(f"TrainerImage: {props.directory} has no Dockerfile")
        self.asset = ecr_assets.DockerImageAsset(
            self, "Asset", directory=str(props.directory), platform=ecr_assets.Platform.LINUX_AMD64,
            build_args={"BASE_IMAGE": props.base_image},
            exclude=["**/__pycache__", "**/*.pyc", "*.egg-info"],
        )
        self.image_uri = self.asset.image_uri
        self.repository = self.asset.repository
