"""A new user's trial (issues #28, #30): qwen2 set at the $0.75 cap the estimate named was a chain of 2 jobs,
expected $0.37, while from $0.83 it is one job, expected $0.26, and nothing said so. When the cap set, or the cap
to set, splits the run into a chain, the estimate names the smallest cap at which the run is one job and the
expected bills of both, in its text, its JSON and the estimate Lambda's plan. The figures compared are the
estimate's own, read from its output (the one job's by estimating again at the cap it names)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from spotrun.cli.main import main

from .test_caps_keep_the_deadline import _plan, _qwen
from .test_new_users_trial import _cli, _with

ONE_JOB = re.compile(r"the run is one job from a cap of \$([0-9][0-9,]*\.[0-9]{2}): expected \$([0-9.,]+) there, "
                     r"\$([0-9.,]+) as the chain of ([0-9]+) jobs at \$([0-9][0-9,]*\.[0-9]{2})")


def _text(tmp_path, capsys, run: dict) -> list[str]:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert main(["estimate", str(path)]) == 0
    return capsys.readouterr().out.splitlines()


def _figures(line: str) -> tuple[float, float, float, int, float]:
    found = ONE_JOB.search(line)
    assert found, line
    one_cap, one_usd, chain_usd, jobs, cap = found.groups()
    return (float(one_cap.replace(",", "")), float(one_usd.replace(",", "")), float(chain_usd.replace(",", "")),
            int(jobs), float(cap.replace(",", "")))


def test_the_named_cap_of_qwen_shows_the_one_job_cap_and_both_expected_bills(tmp_path, capsys, monkeypatch):
    code, at_50 = _cli(tmp_path, capsys, "estimate", _qwen())
    assert code == 0, at_50
    # the cap to set then, $0.75 (a chain of 2 jobs); since #26 it is $0.88, where the runs finish on 99%: one job
    named = 0.75
    assert at_50["spot_policy"]["cap_to_set_usd"] > named, at_50["spot_policy"]
    set_at = _with(_qwen(), budget={"max_usd": named})
    code, doc = _cli(tmp_path, capsys, "estimate", set_at)
    assert code == 0, doc
    seg = doc["segments"]
    assert seg["segments"] > 1, seg  # the case: the named cap splits the run
    one_cap, one_usd = seg["one_job_cap_usd"], seg["one_job_expected_usd"]
    assert one_cap > named and one_usd < seg["spot_cost_usd"], seg

    # the one-job cap holds what it says: estimated again there, one job whose cost row is the bill named; a cent
    # under it, a chain
    code, there = _cli(tmp_path, capsys, "estimate", _with(set_at, budget={"max_usd": one_cap}))
    assert code == 0 and there["segments"]["segments"] == 1, there["segments"]
    assert there["cost_usd"]["spot"] == round(one_usd, 2), (there["cost_usd"], one_usd)
    assert there["segments"]["one_job_cap_usd"] is None and "one job from" not in there["segments"]["line"]
    code, under = _cli(tmp_path, capsys, "estimate", _with(set_at, budget={"max_usd": round(one_cap - 0.01, 2)}))
    assert code == 0 and under["segments"]["segments"] > 1, under["segments"]

    # the text: the cap row says both bills, the chain's as the cost row says it
    lines = _text(tmp_path, capsys, set_at)
    row = next(line for line in lines if line.startswith("cap "))
    cost = next(line for line in lines if line.startswith("cost "))
    assert _figures(row) == (one_cap, round(one_usd, 2), doc["cost_usd"]["spot"], seg["segments"], named), row
    assert f"the planner's expected spot bill ${doc['cost_usd']['spot']:,.2f}" in cost, cost

    # the estimate Lambda's plan carries the same figures
    plan = _plan(monkeypatch, set_at)
    assert (plan["segments"]["one_job_cap_usd"], plan["segments"]["one_job_expected_usd"]) == (one_cap, one_usd)

    # at a cap that carries the run as one job, the cap to set still splits it: the policy's last line says so
    # (qwen2's cap to set is one job since #26, where its runs finish on 99%: mistral-7b-lora's splits)
    mistral = json.loads((Path(__file__).parents[2] / "examples/runs/mistral-7b-lora.json").read_text())
    code, told = _cli(tmp_path, capsys, "estimate", mistral)
    policy, to_set = told["spot_policy"], told["spot_policy"]["cap_to_set_usd"]
    assert told["segments"]["segments"] == 1 and told["segments"]["one_job_cap_usd"] is None, told["segments"]
    code, at_set = _cli(tmp_path, capsys, "estimate", _with(mistral, budget={"max_usd": to_set}))
    chain = at_set["segments"]
    assert code == 0 and chain["segments"] > 1, chain
    assert (policy["one_job_cap_usd"], policy["one_job_expected_usd"]) == \
        (chain["one_job_cap_usd"], chain["one_job_expected_usd"]), policy
    assert (policy["cap_to_set_jobs"], policy["cap_to_set_expected_usd"]) == (chain["segments"], chain["spot_cost_usd"])
    named_line = next(line for line in _text(tmp_path, capsys, mistral) if "the cap to set:" in line)
    assert _figures(named_line) == (chain["one_job_cap_usd"], round(chain["one_job_expected_usd"], 2),
                                    at_set["cost_usd"]["spot"], chain["segments"], to_set), named_line


def test_a_run_that_is_one_job_shows_nothing_new(tmp_path, capsys, monkeypatch):
    """qwen2 on-demand: one job at the cap set and at the cap to set."""
    run = _with(_qwen(), compute={"spot": False})
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0, doc
    named = doc["spot_policy"]["p95_finish_cap_usd"]
    for there in (doc, _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": named}))[1],
                  _plan(monkeypatch, run)):
        assert there["segments"]["segments"] == 1, there["segments"]
        assert there["segments"]["one_job_cap_usd"] is None and there["segments"]["one_job_expected_usd"] is None
        assert there["spot_policy"]["one_job_cap_usd"] is None, there["spot_policy"]
    assert not [line for line in _text(tmp_path, capsys, run) if "one job from a cap" in line]
