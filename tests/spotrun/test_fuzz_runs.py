"""Fuzzing the two front ends with odd and invalid run files: zero tracebacks, zero invalid runs accepted.

Its own generator (beside the hypothesis tests of test_contract.py) writes >= 1,000 run files of the kinds that
once broke them: huge integers, NaN/Infinity literals, duplicate keys, undecodable bytes, UTF-16/32, nesting deep
enough to hit recursion limits, 10 MB files, unknown keys with newlines or megabytes of text, SageMaker's tag and
name patterns, reserved tags, `version: 1.0`, `tie_word_embeddings: "false"`, an inline config over the
hyperparameter limit, runs that need more than 28 days. Each case knows the field its error must name and the exit
code (2 invalid, 3 refused by the planner). Every case goes through `spotrun estimate --bucket --group` (the
whole chain) and, where the Lambda could receive it, through the estimate handler; both read the sources from S3
(moto). A sample also runs as a real process, to see that nothing reaches stderr but one line per file.
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from spotrun.cli.estimate import run_command
from spotrun.cli.main import build_parser, main
from spotrun.contract.spec import join
from spotrun.pipeline.plan import PipelineSettings, plan

ROOT = Path(__file__).resolve().parents[2]
BUCKET, GROUP = "art-bucket", "spotrun-models"
SETTINGS = PipelineSettings(bucket=BUCKET, job_prefix="spotrun-dev-", model_package_group=GROUP, poll_seconds=60,
                            project="spotrun", stage="dev", cost_center="ml-platform")
QWEN = json.loads((ROOT / "examples" / "runs" / "qwen2-0.5b-full-small.json").read_text()
                  .replace("your-artifact-bucket", BUCKET))
RANDOM_INIT = {"version": 1, "name": "tiny-random", "model": {"init": "random", "config": {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 256, "tie_word_embeddings": False}},
    "data": {"source": f"s3://{BUCKET}/datasets/tiny/", "seq_len": 128},
    "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 20}, "tags": {"team": "nlp"}}
BASES = (QWEN, RANDOM_INIT)
MARK = "__FUZZ__"


@dataclass
class Case:
    kind: str
    data: bytes | None  # the run file, or None when no file can hold it (an integer Python cannot print)
    obj: object  # what the Lambda would receive, or MARK when no event can carry it (bytes-level oddities)
    field: str  # the error must name this field (a prefix: deep paths continue it)
    code: int  # 2 invalid input, 3 refused by the planner


def _set(raw: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(raw)
    target = out
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    return out


def _case(kind: str, raw, field: str, code: int = 2, literal: str | None = None) -> Case:
    """A case from a run object; `literal` replaces the MARK string in the file (values json cannot write)."""
    text = json.dumps(raw, allow_nan=True, ensure_ascii=False)
    obj = raw
    if literal is not None:
        text = text.replace(json.dumps(MARK), literal)
        obj = MARK
    return Case(kind, text.encode("utf-8", "surrogatepass"), obj, field, code)


LEAVES = [("version",), ("name",), ("data", "source"), ("data", "seq_len"), ("training", "epochs"),
          ("training", "micro_batch"), ("training", "grad_accum"), ("training", "lr"), ("training", "seed"),
          ("compute", "instance_type"), ("compute", "spot"), ("compute", "instance_count"),
          ("compute", "accepted_delay_hours"), ("compute", "on_demand_fallback"), ("checkpoint", "interval_minutes"),
          ("checkpoint", "keep"), ("budget", "max_usd"), ("registry", "approval_status"), ("tags", "team")]


def _deep(depth: int):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def _leaf_cases(rng: random.Random) -> list[Case]:
    base = rng.choice(BASES)
    path = rng.choice([p for p in LEAVES if p[0] in base or p[0] in ("training", "checkpoint", "registry")])
    field = ".".join(path)
    digits = rng.choice([19, 25, 40, 41, 400, 4301, 6000])
    number = "-" * rng.randint(0, 1) + "9" * digits
    cases = [
        _case("nan-literal", _set(base, path, MARK), field, literal=rng.choice(["NaN", "Infinity", "-Infinity"])),
        _case("float-overflow", _set(base, path, MARK), field, literal=f"1e{rng.randint(309, 99999)}"),
        _case("huge-integer", _set(base, path, MARK), field, literal=number),
        _case("nan-value", _set(base, path, rng.choice([float("nan"), float("inf"), float("-inf")])), field),
        _case("deep-nesting", _set(base, path, _deep(rng.choice([17, 50, 800]))), field),
        _case("recursion-limit", _set(base, path, MARK), "run", literal="[" * 100_000 + "]" * 100_000),
        _case("surrogate", _set(base, path, MARK), field, literal='"\\ud800x"'),
        _case("megabytes-of-text", _set(base, path, "x" * rng.choice([5000, 200_000])), field),
        _case("wrong-type", _set(base, path, rng.choice([[], {}, [1, 2], {"a": 1}])), field),
    ]
    obj_huge = 10 ** rng.choice([19, 40, 5000])
    cases.append(Case("huge-integer-object", None, _set(base, path, obj_huge), field, 2))
    return cases


def _tag_cases(rng: random.Random) -> list[Case]:
    base = rng.choice(BASES)
    reserved = rng.choice(["project", "stage", "cost-center", "run", "execution", "Project", "COST-CENTER"])
    bad_key = rng.choice(["a\nb", "x*y", "tab\there", "emoji\U0001F600", "", "k" * 129, "aws:owner", "AWS:x",
                          "semi;colon", "quote\"d", "a\x00b"])
    bad_value = rng.choice(["line\n", "x*y", "v" * 257, "\U0001F680", "<tag>", "a\tb"])
    many = {f"t{i}": "v" for i in range(rng.randint(44, 60))}
    return [
        _case("reserved-tag", _set(base, ("tags", reserved), "x"), f"tags.{reserved}"),
        _case("tag-key-pattern", _set(base, ("tags",), {bad_key: "v"}), "tags."),
        _case("tag-value-pattern", _set(base, ("tags",), {"team": bad_value}), "tags.team"),
        _case("tag-value-type", _set(base, ("tags",), {"team": rng.choice([1, True, None, ["a"]])}), "tags.team"),
        _case("too-many-tags", _set(base, ("tags",), many), "tags"),
    ]


def _name_cases(rng: random.Random) -> list[Case]:
    base = rng.choice(BASES)
    bad = rng.choice(["run\n", "run\r\n", "-run", "run-", "ru_n", "r" * 49, "", " run", "run name", "rün",
                      "run\u2028x", "run.1"])
    group = rng.choice(["group\n", "bad group", "g" * 64, "-g", "g-"])
    version = rng.choice([1.0, "1", True, 2, 0, -1, None, [1]])
    return [
        _case("job-name-pattern", _set(base, ("name",), bad), "name"),
        _case("group-pattern", _set(base, ("registry", "model_package_group"), group), "registry.model_package_group"),
        _case("version-type", _set(base, ("version",), version), "version"),
    ]


def _model_cases(rng: random.Random) -> list[Case]:
    rand, qwen = RANDOM_INIT, QWEN
    flag = rng.choice(["tie_word_embeddings", "attention_bias", "mlp_bias"])
    dim = rng.choice(["hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size"])
    padding = {f"extra_{i}": "p" * 60 for i in range(rng.randint(40, 60))}
    return [
        _case("config-boolean-as-string", _set(rand, ("model", "config", flag), rng.choice(["false", "true", 0, 1])),
              f"model.config.{flag}"),
        _case("config-dimension", _set(rand, ("model", "config", dim), rng.choice(["4096", 1.5, 0, -1, 2**40])),
              f"model.config.{dim}"),
        _case("config-over-hyperparameter-limit", _set(rand, ("model", "config"), {**rand["model"]["config"],
                                                                                     **padding}), "model.config"),
        _case("config-model-type", _set(rand, ("model", "config", "model_type"), rng.choice(["phi3", "bert", 7])),
              "model.config"),
        _case("random-with-source", _set(rand, ("model", "source"), f"s3://{BUCKET}/models/m/"), "model.source"),
        _case("init-value", _set(qwen, ("model", "init"), rng.choice(["Random", "scratch", True, 1])), "model.init"),
        _case("shape-without-init", _set(rand, ("model",), {"config": rand["model"]["config"]}), "model.init"),
        _case("pretrained-without-source", _set(rand, ("model", "init"), "pretrained"), "model.source"),
        _case("bare-count", _set(qwen, ("model",), {"parameters": 10**9}), "model.parameters"),
        _case("model-source-outside", _set(qwen, ("model", "source"), rng.choice([
            f"s3://{BUCKET}/datasets/m/", "s3://other-bucket/models/m/", "/local/model",
            "s3://your-artifact-bucket/models/m/", f"s3://{BUCKET}/models/m\n", "s3://Bad_Bucket/models/",
            f"s3://{BUCKET}/models/" + "k" * 1100])),
            "model.source"),
        _case("data-source-outside", _set(qwen, ("data", "source"), rng.choice([
            f"s3://{BUCKET}/models/d/", "s3://other-bucket/datasets/d/", "relative/dir", f"s3://{BUCKET}/datasets\t/"])),
            "data.source"),
        _case("missing-model-source-object", _set(qwen, ("model", "source"), f"s3://{BUCKET}/models/absent/"),
              "model.source"),
    ]


def _training_cases(rng: random.Random) -> list[Case]:
    base = rng.choice(BASES)
    lora = {"rank": 8}
    bad = rng.choice([("rank", 0), ("rank", 1.0), ("alpha", 0), ("alpha", "16"), ("dropout", 1.0), ("dropout", -0.1),
                      ("target_modules", "q_proj"), ("target_modules", []), ("target_modules", ["q proj"]),
                      ("target_modules", [1]), ("scaling", 2)])
    training = {**base.get("training", {}), "method": "lora", "lora": {**lora, bad[0]: bad[1]}}
    return [
        _case("lora-settings", _set(base, ("training",), training), f"training.lora.{bad[0]}"),
        _case("method", _set(base, ("training", "method"), rng.choice(["qlora", "FULL", "", None])),
              "training.method"),
        _case("interval", _set(base, ("checkpoint", "interval_minutes"), rng.choice([0, -1, "often", "auto ", 1e9])),
              "checkpoint.interval_minutes"),
    ]


def _structure_cases(rng: random.Random) -> list[Case]:
    base = rng.choice(BASES)
    key = rng.choice(["extra", "line\nbreak", "k" * rng.choice([300, 100_000]), "é", "Name", "version "])
    section = rng.choice([(), ("model",), ("data",), ("training",), ("compute",), ("checkpoint",), ("budget",)])
    target = _set(base, section + (key,), 1) if section else {**copy.deepcopy(base), key: 1}
    field = join(".".join(section), key)
    required = rng.choice([("version",), ("name",), ("model",), ("data",), ("budget",), ("data", "seq_len"),
                           ("budget", "max_usd")])
    removed = copy.deepcopy(base)
    holder = removed
    for part in required[:-1]:
        holder = holder[part]
    del holder[required[-1]]
    top = rng.choice([[], "run", 42, None, True, [base]])
    return [
        _case("unknown-key", target, field),
        _case("missing-required", removed, ".".join(required)),
        _case("not-an-object", top, "run"),
    ]


def _bytes_cases(rng: random.Random) -> list[Case]:
    base = rng.choice(BASES)
    text = json.dumps(base)
    cut = rng.randint(1, len(text) - 2)
    dup_key, dup_field = rng.choice([('"name": ', "name"), ('"seq_len": ', "data.seq_len"), ('"tags": ', "tags"),
                                     ('"model_type": ', "model.config.model_type")])
    at = text.find(dup_key)
    duplicated = text[:at] + dup_key + json.dumps("first") + ", " + text[at:] if at >= 0 else None
    encoding = rng.choice(["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
    cases = [
        Case("undecodable-bytes", text[:cut].encode() + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"])
             + text[cut:].encode(), MARK, "run", 2),
        Case("utf-16-32", text.encode(encoding), MARK, "run", 2),
        Case("truncated", text[:cut].encode(), MARK, "run", 2),
        Case("trailing-garbage", (text + rng.choice(["x", "}", ",", "{}"])).encode(), MARK, "run", 2),
        Case("empty", rng.choice([b"", b" ", b"\n", b"\xef\xbb\xbf"]), MARK, "run", 2),
    ]
    if duplicated:
        cases.append(Case("duplicate-key", duplicated.encode(), MARK, dup_field, 2))
    return cases


def _refusal_cases(rng: random.Random) -> list[Case]:
    qwen = QWEN
    return [
        # The planner's InvalidRun refusals exit 2 as every InvalidRun does; OverBudget alone exits 3 (exits.py).
        _case("needs-more-than-28-days", _set(qwen, ("data", "tokens"), rng.choice([10**12, 10**13, 10**15])),
              "compute.accept_max_runtime_stop", 2),
        _case("over-budget", _set(qwen, ("budget", "max_usd"), rng.choice([0.01, 0.05])), "budget.max_usd", 3),
        _case("warm-pool-with-spot", _set(qwen, ("compute", "warm_pool_minutes"), rng.randint(1, 60)),
              "compute.warm_pool_minutes", 2),
        _case("max-wait-below-runtime", _set(qwen, ("compute", "max_wait_hours"), rng.choice([0.01, 0.5])),
              "compute.max_wait_hours", 2),
        _case("instance-not-in-catalog", _set(qwen, ("compute", "instance_type"), "ml.zz9.xlarge"),
              "compute.instance_type", 2),
    ]


GENERATORS = [_leaf_cases, _tag_cases, _name_cases, _model_cases, _training_cases, _structure_cases, _bytes_cases,
              _refusal_cases]


def generate(seed: int = 9, rounds: int = 24) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for _ in range(rounds):
        for gen in GENERATORS:
            cases.extend(gen(rng))
    big = json.dumps({**QWEN, "notes": "n" * (10 << 20)}).encode()  # 10 MB files
    cases += [Case("10-megabytes", big, MARK, "run", 2),
              Case("10-megabytes-of-nesting", b"[" * (5 << 20) + b"]" * (5 << 20), MARK, "run", 2)]
    return cases


CASES = generate()


@pytest.fixture(scope="module")
def s3():
    """The sources both front ends read: each base's model config.json and its data's index.json."""
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="models/qwen2-0.5b/config.json", Body=json.dumps(QWEN["model"]["config"]))
        client.put_object(Bucket=BUCKET, Key="datasets/tiny/index.json", Body=json.dumps({"total_tokens": 10**6}))
        yield client


def _one_line_naming(doc: dict, case: Case) -> None:
    message = doc["message"]
    # one line; an over-budget refusal names its smallest cap, the cap to set, the on-demand bound and the held-out
    # margin of the odds it quotes at them (qwen2 at $0.01: 1,218 characters), so the bound is 1,500, not a dump
    assert "\n" not in message and "\r" not in message and len(message) <= 1500, (case.kind, len(message))
    assert doc["field"].startswith(case.field), (case.kind, doc["field"], case.field, message)
    assert doc["field"] in message or doc["field"] == "run", (case.kind, message)


def test_the_generator_covers_every_kind_with_over_a_thousand_files():
    assert len(CASES) >= 1000
    kinds = {c.kind for c in CASES}
    for kind in ("huge-integer", "nan-literal", "duplicate-key", "undecodable-bytes", "utf-16-32", "deep-nesting",
                 "recursion-limit", "10-megabytes", "unknown-key", "reserved-tag", "tag-key-pattern",
                 "job-name-pattern", "version-type", "config-boolean-as-string", "config-over-hyperparameter-limit",
                 "needs-more-than-28-days"):
        assert kind in kinds


def test_the_cli_refuses_every_case_by_field_with_its_exit_code(s3, tmp_path, capsys):
    seen = {2: 0, 3: 0}
    for i, case in enumerate(c for c in CASES if c.data is not None):
        path = tmp_path / f"case-{i}.json"
        path.write_bytes(case.data)
        args = build_parser().parse_args(["estimate", "--format", "json", "--bucket", BUCKET, "--group", GROUP,
                                          str(path)])
        code = run_command(args, plan=True, s3_client=s3)  # main() with moto's S3 client passed in
        out = capsys.readouterr().out
        assert code == case.code, (case.kind, code, out[:500])
        _one_line_naming(json.loads(out), case)
        seen[code] += 1
        path.unlink()
    assert seen[2] >= 900 and seen[3] == sum(c.kind == "over-budget" for c in CASES)


def test_the_estimate_handler_refuses_every_case_by_field(s3):
    count = 0
    for case in CASES:
        if case.obj == MARK:
            continue  # bytes no Lambda event can carry (a Step Functions input is valid UTF-8 JSON)
        out = plan(case.obj, "exec-1", SETTINGS, s3_client=s3)
        want = "OverBudget" if case.kind == "over-budget" else "InvalidRun"
        assert out["status"] == want, (case.kind, out)
        _one_line_naming(out, case)
        count += 1
    assert count >= 700


def test_odd_but_valid_runs_are_accepted_by_both(s3, tmp_path, capsys):
    odd = [
        _set(QWEN, ("tags",), {"Ünïcode value": "café 東京 + = @ / :", **{f"t{i}": "" for i in range(42)}}),
        _set(QWEN, ("checkpoint", "interval_minutes"), 1e-9),  # saves every second, never "off"
        _set(RANDOM_INIT, ("training",), {"method": "lora", "lora": {"rank": 4, "alpha": 8, "dropout": 0.1}}),
        _set(QWEN, ("compute", "accept_max_runtime_stop"), True),
    ]
    for i, raw in enumerate(odd):
        path = tmp_path / f"odd-{i}.json"
        path.write_bytes(b"\xef\xbb\xbf" + json.dumps(raw, ensure_ascii=False).encode())  # with a UTF-8 BOM
        assert main(["estimate", "--format", "json", "--bucket", BUCKET, "--group", GROUP, str(path)]) == 0
        assert json.loads(capsys.readouterr().out)["status"] == "ok"
        assert plan(raw, "exec-1", SETTINGS, s3_client=s3)["status"] == "ok"
    assert float(plan(odd[1], "e", SETTINGS, s3_client=s3)["hyperparameters"]["checkpoint.interval_s"]) > 0


def test_as_a_process_each_bad_file_is_one_line_on_stderr_and_no_traceback(tmp_path):
    # Kinds the contract and the stage's rules find (validate neither reads sources nor plans).
    kinds = {"nan-literal", "huge-integer", "deep-nesting", "recursion-limit", "surrogate", "reserved-tag",
             "tag-key-pattern", "job-name-pattern", "version-type", "duplicate-key", "undecodable-bytes", "utf-16-32",
             "unknown-key", "model-source-outside", "shape-without-init", "10-megabytes"}
    sample = [c for c in CASES if c.kind in kinds][::7][:60]
    paths = []
    for i, case in enumerate(sample):
        paths.append(tmp_path / f"p{i}.json")
        paths[-1].write_bytes(case.data)
    res = subprocess.run([sys.executable, "-m", "spotrun", "validate", "--bucket", BUCKET, "--group", GROUP,
                          *map(str, paths)], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
                         env={"PATH": "/usr/bin:/bin", "AWS_EC2_METADATA_DISABLED": "true"})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == len(sample)
    assert all(": InvalidRun: " in line for line in lines)
