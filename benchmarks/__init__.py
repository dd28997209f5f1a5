"""Benchmarks: standalone scripts (`python benchmarks/<name>.py`, with spotrun and spotrun_trainer installed, as
`make venv` does); restart_cost.py imports the image tests' helpers and runs as `python -m benchmarks.restart_cost`
from the repository root. A package so that tests import the presets (`benchmarks.throughput`)."""
