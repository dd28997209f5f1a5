"""Local runs: the same run JSON through the same stages on this machine, without AWS.

    harness.py    the container's entry point on a SageMaker-shaped directory; spot-style interruptions
    examples.py   tiny assets built locally (corpus, tokenizer, pretrained-shaped model); no hub
    pipeline.py   `spotrun local`: validate + estimate -> prepare -> launch/interrupt/restart -> register -> report
    report_files.py  report.json, report.txt and loss.png (matplotlib) of a local run
    registry.py   a directory of versioned model packages with the AWS path's metadata
    demo.py       `make demo`: the shipped example run, interrupted and uninterrupted, weights compared

None of this is in the trainer image: the image ships only what runs inside SageMaker (training_image/). The
trainer package (`spotrun_trainer`, training_image/pyproject.toml) is installed beside this one: `make venv`
installs both.
"""
