# spotrun: every target installs what it needs itself on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20

# TORCH_CPU=1 installs torch's CPU-only build first (from PyTorch's CPU index), so a Linux machine without a
# GPU does not pull the multi-GB CUDA build for the demo and the tests: `make venv TORCH_CPU=1`. Unset (the
# default), pip resolves torch as usual. The pin stays training_image/requirements.txt's (2.13.0 matches
# 2.13.0+cpu).
TORCH_CPU ?=
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: venv node test demo docs synth torture torture-lora bench-checkpoint bench-throughput clean

# Both packages are installed (editable): `spotrun` (pyproject.toml) and the trainer `spotrun_trainer`
# (training_image/pyproject.toml), which `spotrun local`/`prepare`, the tests and the benchmarks import.
$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-dev-nodeps.txt \
		training_image/requirements.txt pyproject.toml training_image/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(if $(TORCH_CPU),$(BIN)/pip install --quiet --disable-pip-version-check --index-url $(TORCH_CPU_INDEX) \
		"$$(grep '^torch==' training_image/requirements.txt)")
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -r requirements-dev-nodeps.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e . -e training_image
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

venv: $(VENV)/.installed
node: node_modules/.installed

## make test: the whole suite (trainer under torchrun, planner, CDK synth + cdk-nag + cfn-lint + asl-validator, moto).
## tests/spotrun (the planner's and the spot policy's simulations: CPU-bound, no shared daemon, host or port) runs on
## TEST_WORKERS processes (pytest-xdist, a whole file per worker so its module fixtures are made once); the rest in
## one process (its session fixtures, one CDK synth, the image build and the Docker daemon, network namespaces with
## fixed names, are made once and not shared between processes). Both always run; either failing fails the target
## (pytest's exit 5, no test collected, too).
TEST_WORKERS ?= 2
test: venv node
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile tests/spotrun; spotrun=$$?; \
	$(BIN)/python -m pytest --ignore=tests/spotrun; rest=$$?; \
	echo "make test: tests/spotrun exit $$spotrun, the rest exit $$rest"; \
	[ $$spotrun -eq 0 ] && [ $$rest -eq 0 ]

## make demo: `spotrun local` on examples/demo/run.json, with one spot interruption and then without; no AWS
demo: venv
	$(BIN)/python -m spotrun demo --out demo-output

## make docs: the docs site (docs/, mkdocs.yml) into site/, strictly: a broken link fails
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

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
	rm -rf cdk.out demo-output runs site .pytest_cache
