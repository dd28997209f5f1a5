"""A deadline met on spot capacity alone says so: without compute.on_demand_fallback no policy can move to
on-demand, so every policy the estimate lists runs the same spot-only schedule, and its P(deadline) is the odds
that spot capacity comes in time, not what a deadline policy guarantees (a new user was told 'ok' at 99.5% by nine
policies named for deadlines; on the public recordings the same run met its deadline on 80.9% of the windows).
`spotrun simulate` shows no optimum for such a run: the optimum may move to on-demand, which the run may not."""

from __future__ import annotations

import json

from .test_caps_keep_the_deadline import _plan, _qwen
from .test_new_users_trial import _cli

LINE = "rests on spot capacity alone"


def _chosen(doc: dict) -> dict:
    return next(r for r in doc["spot_policy"]["policies"] if r["label"] == doc["spot_policy"]["chosen"])


def test_a_deadline_without_on_demand_fallback_is_said_to_rest_on_spot_alone(tmp_path, capsys, monkeypatch):
    alone = _qwen(deadline_hours=12)
    code, doc = _cli(tmp_path, capsys, "estimate", alone)
    assert code == 0, doc
    for told in (doc, _plan(monkeypatch, alone)):
        said = [w for w in told["warnings"] if LINE in w]
        assert len(said) == 1, told["warnings"]
        # the odds named are the chosen row's, as the table prints them
        assert f"the {_chosen(told)['p_deadline']:.1%} is the odds" in said[0], (said, _chosen(told))
        assert "compute.on_demand_fallback=true" in said[0], said
    # with the fallback the deadline policies can move to on-demand: no such line
    code, fallback = _cli(tmp_path, capsys, "estimate", _qwen(deadline_hours=12, on_demand_fallback=True))
    assert code == 0 and not [w for w in fallback["warnings"] if LINE in w], fallback["warnings"]
    # no deadline: nothing to say about one
    code, none = _cli(tmp_path, capsys, "estimate", _qwen())
    assert code == 0 and not [w for w in none["warnings"] if LINE in w], none["warnings"]


def test_simulate_shows_no_optimum_for_a_run_that_cannot_go_on_demand(tmp_path, capsys):
    out = {}
    for fallback in (False, True):
        run = _qwen(deadline_hours=12, on_demand_fallback=fallback)
        (tmp_path / "run.json").write_text(json.dumps(run))
        code, doc = _cli(tmp_path, capsys, "simulate", run, "--n", "100", "--out", str(tmp_path / f"sim{fallback}"))
        assert code == 0, doc
        out[fallback] = (doc, (tmp_path / f"sim{fallback}" / "simulate.txt").read_text())
    doc, text = out[False]
    assert "optimum" not in doc and "no optimum: compute.on_demand_fallback=false" in text, text
    best = max(r["p_deadline"] for r in doc["policies"])
    assert LINE in text and f"the {best:.1%} is the odds" in text, text
    doc, text = out[True]
    assert "optimum" in doc and "no optimum" not in text and LINE not in text, text
