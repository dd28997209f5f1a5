"""Local runs: the same run JSON through the same stages on this machine, without AWS.

    harness.py    the container's entry point on a SageMaker-shaped directory; spot-style interruptions
    examples.py   tiny assets built locally (corpus, tokenizer, pretrained-shaped model); no hub
    pipeline.py   `spotrun local`: validate + estimate -> prepare -> launch/interrupt/restart -> register -> report
    registry.py   a directory of versioned model packages with the AWS path's metadata
    demo.py       `make demo`: the shipped example run, interrupted and uninterrupted, weights compared

None of this is in the trainer image: the image ships only what runs inside SageMaker (training_image/).
The trainer package is imported from the checkout's training_image/ directory (see `trainer_on_path`).
"""

from __future__ import annotations

import sys
from pathlib import Path

TRAINER_ROOT = Path(__file__).resolve().parents[2] / "training_image"


def trainer_on_path() -> None:
    """Make `spotrun_trainer` importable from the checkout (it is the image's package, not installed here)."""
    if str(TRAINER_ROOT) not in sys.path:
        sys.path.insert(0, str(TRAINER_ROOT))
