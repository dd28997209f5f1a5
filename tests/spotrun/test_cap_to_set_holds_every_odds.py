"""A new user's trial: the cap to set holds every odds it quotes (the finish share too, where no policy meets the
deadline), and a deadline that cannot bind does not raise it. Every figure compared is the estimate's own, read from
its output at the cap it names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_new_users_trial import _cli, _with

ROOT = Path(__file__).parents[2]
# pinned to the layout the example takes without a deadline (1 x g6e.48xlarge, a ~10 h run)
G6E = {"instance_type": "ml.g6e.48xlarge", "instance_count": 1}


def _llama(**compute) -> dict:
    example = json.loads((ROOT / "examples/runs/llama3-8b-full.json").read_text())
    example["compute"].pop("accepted_delay_hours")
    return _with(example, compute={**G6E, **compute})


def _at(tmp_path, capsys, run: dict, cap: float) -> dict:
    code, doc = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": cap}))
    assert code == 0, doc
    return doc


def _chosen(doc: dict) -> dict:
    policy = doc["spot_policy"]
    return next(r for r in policy["policies"] if r["label"] == policy["chosen"])


def test_a_missed_deadlines_cap_to_set_holds_the_finish_share(tmp_path, capsys):
    """llama3-8b-full on 1 x g6e.48xlarge (~10 h) with a 3 h deadline accepted as missed: no policy meets it, and the
    cap to set ($153.58) was searched on P(deadline) alone (0.0% everywhere), so at it only 59.4% of the simulated
    runs finished. It holds the finish share now, as the run without a deadline does (99%), and says so."""
    run = _llama(deadline_hours=3, accept_missed_deadline=True)
    doc = _at(tmp_path, capsys, run, 2500)
    policy = doc["spot_policy"]
    assert _chosen(doc)["p_deadline"] == 0.0 and _chosen(doc)["p_finished"] >= 0.99, policy  # the case
    cap = policy["cap_to_set_usd"]
    there = _at(tmp_path, capsys, run, cap)
    assert _chosen(there)["p_finished"] >= 0.99, there["spot_policy"]
    assert policy["cap_to_set_holds"] == ["finish share"], policy
    assert there["spot_policy"]["cap_to_set_usd"] == cap  # set, the same cap is named
    assert policy["cap_to_set_row"]["p_finished"] == _chosen(there)["p_finished"]  # the line quotes the row there
    code, text = _cli_text(tmp_path, capsys, _with(run, budget={"max_usd": 2500}))
    line = next(s for s in text.splitlines() if s.strip().startswith("the cap to set:"))
    assert f"its runs finish on {_chosen(there)['p_finished']:.1%}" in line and "holds the finish share" in line, line


def _cli_text(tmp_path, capsys, run: dict) -> tuple[int, str]:
    from spotrun.cli.main import main

    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    code = main(["estimate", str(path)])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("hours", [48, 200, 1344])
def test_a_deadline_that_cannot_bind_does_not_raise_the_cap_to_set(tmp_path, capsys, hours):
    """The same run with a 48 / 200 / 1344 h deadline (every policy meets it on >= 99% as one job) named $381-397
    against $166.63 without a deadline, and a cap meeting it on 99.2% was warned 'under the cap to set': the search
    only counted caps where the estimate chose the one-job policy and its mean there was no more than the other
    policies' one-job means (a chain's restarts raise every policy's mean, and tied policies trade the choice)."""
    free = _at(tmp_path, capsys, _llama(), 2500)["spot_policy"]["cap_to_set_usd"]  # without a deadline
    run = _llama(deadline_hours=hours)
    doc = _at(tmp_path, capsys, run, 2500)
    policy = doc["spot_policy"]
    assert all(r["p_deadline"] >= 0.99 for r in policy["policies"]), policy  # the deadline cannot bind
    cap = policy["cap_to_set_usd"]
    assert cap <= free, (cap, free)
    assert policy["cap_to_set_holds"] == ["P(deadline)", "finish share"], policy
    there = _at(tmp_path, capsys, run, cap)
    row = _chosen(there)
    assert row["p_deadline"] >= 0.99 and row["p_finished"] >= 0.99, there["spot_policy"]
    at_free = _at(tmp_path, capsys, run, free)  # the cap the run without a deadline names: not 'under' this one
    assert _chosen(at_free)["p_deadline"] >= 0.99, at_free["spot_policy"]
    assert not [w for w in at_free["warnings"] if "under the cap to set" in w], at_free["warnings"]


def test_a_one_job_cap_kept_for_the_deadline_quotes_the_estimate_at_it(tmp_path, capsys, monkeypatch):
    """Where the one-job cap is kept for the deadline's odds and no cap was proven (the search stood down here), the
    line quoted the run's P95 under no cap ('finishes at maxwait_fallback (notice)'s P95 bill ($138.86)'); it quotes
    the estimate simulated at that cap: the policy chosen there and its odds, the row the JSON carries."""
    from spotrun.policy import choose

    monkeypatch.setattr(choose, "_settled_cap", lambda run, est, catalog, poll, cap, one_job, least: (cap, None, False))
    run = _llama(deadline_hours=48)
    doc = _at(tmp_path, capsys, run, 2500)
    policy = doc["spot_policy"]
    assert policy["p95_finish_keeps_deadline"], policy  # the case: the one-job cap kept
    cap = policy["cap_to_set_usd"]
    row = _chosen(_at(tmp_path, capsys, run, cap))  # the estimate at that cap
    assert policy["cap_to_set_row"] == row, (policy["cap_to_set_row"], row)
    code, text = _cli_text(tmp_path, capsys, _with(run, budget={"max_usd": 2500}))
    line = next(s for s in text.splitlines() if s.strip().startswith("the cap to set:"))
    assert f"simulated at it, the estimate chooses {row['label']}" in line and "P95 bill" not in line, line
    assert f"its runs finish on {row['p_finished']:.1%}" in line, line
