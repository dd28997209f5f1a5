"""The settings tree (a seam, stdlib only): what reaches the trainer, one dataclass per component, named by the run
JSON's dotted paths where both mean the same (`training.lr`, `checkpoint.interval_s`, `export.from`).

The tree is the trainer's configuration (spotrun_trainer imports it) and what the planner fills
(spotrun/planner/outputs.py `trainer_settings`). Units are seconds: the run contract converts the user's minutes and
hours once. `checks` (ConfigError and the refusals), `sections` (one dataclass per component), `tree` (the root,
`TrainConfig`, and the run's `training` section), `wire` (flatten/parse: SageMaker hyperparameters and the
workers' JSON file).
"""
