# spotrun: every target installs what it needs itself on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PYTHONPATH := $(CURDIR):$(CURDIR)/training_image

.PHONY: venv node test demo synth torture torture-lora bench-checkpoint bench-throughput clean

$(VENV)/.installed: requirements.txt requirements-dev.txt training_image/requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

venv: $(VENV)/.installed
node: node_modules/.installed

## make test: the whole suite (trainer under torchrun, planner, CDK synth + cdk-nag + cfn-lint + asl-validator, moto)
test: venv node
	$(BIN)/python -m pytest

## make demo: the main job on the embedded default, no AWS account (see README)
demo: venv
	$(BIN)/python -m spotrun_trainer demo --out demo-output

## make synth: synthesize the CDK app into cdk.out (no AWS credentials, no Docker needed)
synth: venv
	$(BIN)/python app.py

torture: venv
	$(BIN)/python benchmarks/torture.py --trials 20

torture-lora: venv
	$(BIN)/python benchmarks/torture.py --trials 20 --method lora

bench-checkpoint: venv
	$(BIN)/python benchmarks/checkpoint_bench.py

bench-throughput: venv
	$(BIN)/python benchmarks/throughput.py

clean:
	rm -rf cdk.out demo-output .pytest_cache
