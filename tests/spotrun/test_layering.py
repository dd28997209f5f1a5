"""The layout's rules, on every module of spotrun/, training_image/, training_constructs/, stacks/ and app.py (read
with ast by tests/spotrun/layering.py; nothing is imported):

- the trainer and the CDK constructs import only spotrun.seams of spotrun (the names that cross into the image and
  the deployed functions), and the trainer the settings tree, spotrun.settings (its own config, which the planner
  fills), and the planner's memory model (TRAINER_ALSO says why);
- the library parts (contract, planner, policy, pipeline) never import the CLI, the local runner or the handlers,
  and nothing outside spotrun/handlers/ imports a handler module; the policy never imports the pipeline (the
  estimate step calls it once and adds its answer to the estimate: spotrun/pipeline/policy_stage.py
  `with_spot_policy`);
- what a Lambda handler imports, followed transitively (imports inside functions too), is the `spotrun` package,
  the standard library and boto3/botocore: what the Lambda asset and runtime hold (no torch, numpy, transformers);
- no import circles among the repository's modules;
- an import inside a function says why in a comment (its line or the line above its run of imports).

Each rule is also run on a tiny fake tree that breaks it, so each can be seen to fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.spotrun.layering import (
    LAMBDA_RUNTIME,
    closure_outside,
    cycle,
    forbidden,
    imports,
    modules,
    unexplained_local_imports,
)

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("spotrun.contract", "spotrun.planner", "spotrun.policy", "spotrun.pipeline")
FRONT = ("spotrun.cli", "spotrun.local", "spotrun.handlers")
# The trainer's one import beyond the seams, on purpose: the planner's memory model (stdlib only) predicts this rank's
# peak beside the measured one in the job's log (spotrun_trainer/memory_check.py, docs/trainer.md), so that the log
# holds the plan's own figure, not a copy's.
# And the one reader of JSON text a user wrote (stdlib only), so that a JSONL record that is not JSON is refused in the
# words of every other JSON file (spotrun/contract/json_text.py).
TRAINER_ALSO = ("spotrun.planner.memory", "spotrun.contract.json_text")
SEAMS_OF_THE_TRAINER = ("spotrun.seams", "spotrun.settings")  # the settings tree is the trainer's config
HANDLERS = sorted(n for n in modules(ROOT) if n.startswith("spotrun.handlers."))


@pytest.fixture(scope="module")
def edges():
    return imports(ROOT)


def test_every_module_of_the_packages_is_read():
    files = {p for folder in ("spotrun", "training_image", "training_constructs", "stacks")
             for p in (ROOT / folder).rglob("*.py")}
    assert files - set(modules(ROOT).values()) == set()
    assert len(HANDLERS) >= 5


def test_the_trainer_imports_only_the_seams_from_spotrun(edges):
    assert forbidden(edges, ("spotrun_trainer",), allowed=(*SEAMS_OF_THE_TRAINER, *TRAINER_ALSO)) == []


def test_the_constructs_import_only_the_seams_from_spotrun(edges):
    assert forbidden(edges, ("training_constructs",), allowed=("spotrun.seams",)) == []
    assert any(e.source.startswith("training_constructs.") and e.target == "spotrun.seams" for e in edges)


def test_the_library_never_imports_the_cli_the_local_runner_or_the_handlers(edges):
    assert forbidden(edges, LIBRARY, banned=FRONT) == []


def test_the_policy_never_imports_the_pipeline(edges):
    assert forbidden(edges, ("spotrun.policy",), banned=("spotrun.pipeline",)) == []
    assert any(e.source == "spotrun.pipeline.policy_stage" and e.target.startswith("spotrun.policy") for e in edges)


def test_no_module_outside_the_handlers_imports_one(edges):
    others = tuple(sorted({e.source for e in edges if not e.source.startswith("spotrun.handlers")}))
    assert forbidden(edges, others, banned=("spotrun.handlers",)) == []


@pytest.mark.parametrize("handler", HANDLERS)
def test_a_lambda_handler_needs_only_the_package_the_stdlib_and_boto3(edges, handler):
    assert closure_outside(edges, handler, LAMBDA_RUNTIME, "spotrun") == []


def test_no_import_circles(edges):
    assert cycle(edges) == []


def test_an_import_inside_a_function_says_why():
    assert unexplained_local_imports(ROOT) == []


# --- the checker on fake trees: each rule can fail (capital module names: placeholders to test_references) ---

def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


FAKE = {"spotrun/__init__.py": "", "spotrun/seams.py": "X = 1\n", "spotrun/planner/__init__.py": "",
        "spotrun/cli/__init__.py": "", "spotrun/cli/main.py": "from ..seams import X\n",
        "spotrun/handlers/__init__.py": "", "spotrun/handlers/H.py": "from spotrun.planner import P\n",
        "training_image/spotrun_trainer/__init__.py": "", "training_constructs/__init__.py": ""}


def test_the_checker_finds_a_part_importing_what_it_must_not(tmp_path):
    root = _tree(tmp_path, {**FAKE, "spotrun/planner/P.py": "import os\nfrom ..cli.main import X\n",
                            "training_image/spotrun_trainer/T.py": "from spotrun.seams import X\n"
                                                                   "from spotrun.planner import P\n",
                            "training_constructs/C.py": "from spotrun import seams\n"})
    edges = imports(root)
    assert forbidden(edges, ("spotrun.planner",), banned=FRONT) == ["spotrun.planner.P:2 imports spotrun.cli",
                                                                    "spotrun.planner.P:2 imports spotrun.cli.main"]
    assert forbidden(edges, ("spotrun_trainer",), allowed=("spotrun.seams",)) == [
        "spotrun_trainer.T:2 imports spotrun.planner", "spotrun_trainer.T:2 imports spotrun.planner.P"]
    assert forbidden(edges, ("training_constructs",), allowed=("spotrun.seams",)) == []


def test_the_checker_follows_a_handler_into_a_function_and_a_package(tmp_path):
    root = _tree(tmp_path, {**FAKE, "spotrun/planner/P.py": "import json\nimport boto3\n"
                                                            "def f():\n    import numpy  # heavy\n"})
    found = closure_outside(imports(root), "spotrun.handlers.H", LAMBDA_RUNTIME, "spotrun")
    assert found == ["spotrun.handlers.H -> spotrun.planner.P -> numpy (line 4 of spotrun.planner.P)"]
    # a module outside the package the Lambda ships is as missing there as torch
    root = _tree(tmp_path, {"spotrun/planner/P.py": "from spotrun_trainer import T\n",
                            "training_image/spotrun_trainer/T.py": ""})
    assert closure_outside(imports(root), "spotrun.handlers.H", LAMBDA_RUNTIME, "spotrun") == [
        "spotrun.handlers.H -> spotrun.planner.P -> spotrun_trainer (line 1 of spotrun.planner.P)",
        "spotrun.handlers.H -> spotrun.planner.P -> spotrun_trainer.T (line 1 of spotrun.planner.P)"]


def test_the_checker_names_a_circle(tmp_path):
    root = _tree(tmp_path, {**FAKE, "spotrun/planner/P.py": "def f():\n    from . import Q  # late\n",
                            "spotrun/planner/Q.py": "from .P import f\n"})
    assert cycle(imports(root)) == ["spotrun.planner.P", "spotrun.planner.Q", "spotrun.planner.P"]
    root = _tree(tmp_path, {"spotrun/planner/P.py": "", "spotrun/planner/__init__.py": "from .q import f\n"})
    assert cycle(imports(root)) == []  # a package importing its submodule, which imports a sibling: no circle


def test_the_checker_wants_a_reason_beside_an_import_inside_a_function(tmp_path):
    root = _tree(tmp_path, {**FAKE, "spotrun/planner/P.py": (
        "import os\n\n\ndef f():\n    import json\n\n\n"
        "def g():\n    # torch takes 6 s to import\n    import csv\n    import torch\n\n\n"
        "def h():\n    import zlib  # only h compresses\n")})
    assert unexplained_local_imports(root) == ["spotrun/planner/P.py:5 (spotrun.planner.P)"]
