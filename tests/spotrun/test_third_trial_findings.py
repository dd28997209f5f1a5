"""Issue #26, "the odds we print are the odds the run gets": what a user is told is what happens. The findings of a
new user's third trial of `spotrun estimate` and `spotrun simulate`, one test (or more) each:

1. an on-demand run's simulate says what is simulated for it (no spot capacity: the traces change nothing);
2. `simulate --policy` with a policy the run cannot take is refused before the estimate runs;
3. the cost line of a spot run whose chosen policy is on_demand does not call its bill spot's;
4. runs that end at the longest MaxRuntime are said with why and what to do, in text and JSON;
5. the cap to set across layouts that never settle names a layout and odds that are true, and says so.

The trial's runs are written here (the trial's files were examples/runs/llama3-8b-full.json with changes)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from spotrun.cli.main import main
from spotrun.contract.spec import parse_run
from spotrun.planner.estimate import estimate, load_catalog, regional_catalog
from spotrun.policy.choose import run_candidates, run_plan, run_policies

LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
            "max_position_embeddings": 8192}
TRIAL_8B = {"version": 1, "name": "llama3-8b-support-chat",
            "model": {"source": "s3://your-artifact-bucket/models/llama3-8b/", "config": LLAMA_8B},
            "data": {"source": "s3://your-artifact-bucket/datasets/support-chat/", "tokens": 200_000_000,
                     "seq_len": 4096},
            "training": {"method": "full", "epochs": 2, "micro_batch": 1, "grad_accum": 8, "lr": 1e-05, "seed": 7},
            "compute": {"instance_type": "auto", "instance_count": "auto", "spot": True},
            "checkpoint": {"interval_minutes": "auto", "keep": 2}, "budget": {"max_usd": 2500},
            "registry": {"approval_status": "PendingManualApproval"}, "tags": {"team": "support"}}
# a small run the planner estimates in a moment (tests/spotrun/test_new_users_trial.py's)
SMALL = {"version": 1, "name": "trial", "model": {"init": "random", "config": {
    "model_type": "gpt2", "n_embd": 256, "n_layer": 4, "n_head": 4}},
    "data": {"source": "s3://your-artifact-bucket/datasets/d1/", "tokens": 200_000_000, "seq_len": 512},
    "compute": {"instance_type": "ml.g5.xlarge"}, "budget": {"max_usd": 500}}


def _run(base: dict, **compute) -> dict:
    out = copy.deepcopy(base)
    out["compute"] = {**out["compute"], **compute}
    return out


def _write(tmp_path: Path, run: dict) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    return path


# ---- 2. --policy refused before the estimate -------------------------------------------------------------------


@pytest.mark.parametrize("compute, policy, can", [
    ({"deadline_hours": 12, "on_demand_fallback": False}, "on_demand", "deadline_greedy, maxwait_fallback"),
    ({"spot": False}, "uniform_progress", "expected one of on_demand ("),
    ({}, "deadline_greedy", "expected one of maxwait_fallback ("),
    # no policy at all: refused naming the run's candidates (argparse named every policy, none of the run's)
    ({"on_demand_fallback": True}, "spot", "is invalid: no such policy; expected one this run can take: "
                                           "maxwait_fallback, on_demand (the policies: deadline_greedy, "),
])
def test_a_policy_the_run_cannot_take_is_refused_before_the_estimate_runs(tmp_path, capsys, monkeypatch, compute,
                                                                          policy, can):
    """The trial's 8B with a 12 h deadline and no fallback, `--policy on_demand`: refused after 9.7 s of estimate.
    The estimate here raises: a refusal that needs it fails the test."""
    import spotrun.cli.simulate as simulate_cli

    def no_estimate(*_a, **_k):
        raise AssertionError("the estimate ran before --policy was refused")

    monkeypatch.setattr(simulate_cli, "check_file", no_estimate)
    path = _write(tmp_path, _run(TRIAL_8B, **compute))
    assert main(["simulate", str(path), "--policy", policy, "--out", str(tmp_path / "out"), "--format", "json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["field"] == "--policy", doc
    assert f"--policy={policy} is " in doc["message"] and can in doc["message"], doc
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("compute", [{}, {"on_demand_fallback": True}, {"deadline_hours": 200},
                                     {"deadline_hours": 200, "on_demand_fallback": True}, {"spot": False},
                                     {"spot": False, "deadline_hours": 200}])
def test_the_policies_checked_before_the_estimate_are_the_candidates_it_simulates(compute):
    """`run_policies` (from the run alone) against `run_candidates` on the estimate's own plan."""
    run = parse_run(_run(SMALL, **compute))
    catalog = regional_catalog(load_catalog(), "us-east-1")
    plan = run_plan(run, estimate(run, catalog=catalog), catalog)
    simulated = list(dict.fromkeys(p for p, _ in run_candidates(run, plan)))
    assert run_policies(run) == simulated


# ---- 1. an on-demand run's simulate says what is simulated for it ------------------------------------------------


def _simulate(tmp_path: Path, capsys, run: dict, *flags: str) -> tuple[dict, str]:
    """simulate's JSON and its text for `run`."""
    path = _write(tmp_path, run)
    out = str(tmp_path / "out")
    assert main(["simulate", str(path), "--n", "50", "--out", out, "--format", "json", *flags]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(path), "--n", "50", "--out", out, *flags]) == 0
    return doc, capsys.readouterr().out


def test_an_on_demand_runs_simulation_says_no_spot_capacity_is_simulated_in_text_and_json(tmp_path, capsys):
    """`spotrun simulate` on the trial's spot=false 8B said '1000 traces (generated: 0 interruptions per job-hour,
    waits for capacity of 0.0 h on average, shaped and bunched as the public recordings')'. Said now: on-demand
    alone, the traces change nothing; and they do not: the rows are the same with an Advisor band's traces."""
    run = _run(SMALL, spot=False)
    doc, text = _simulate(tmp_path, capsys, run)
    for source in (doc["source"], text.splitlines()[0]):
        assert "on-demand alone: compute.spot=false takes no spot capacity" in source, source
        assert "generated" not in source and "shaped and bunched" not in source, source
    banded, banded_text = _simulate(tmp_path, capsys, run, "--band", ">20%")
    assert "the traces given change nothing either: Advisor band >20%" in banded["source"], banded["source"]
    assert banded["source"] in banded_text.splitlines()[0]
    assert banded["policies"] == doc["policies"] and [r["label"] for r in doc["policies"]] == ["on_demand"]
    row = doc["policies"][0]
    assert row["mean_interruptions"] == 0 and row["p50_usd"] == row["p95_usd"], row
    assert row["mean_usd"] == pytest.approx(row["p95_usd"], rel=1e-12), row  # one bill (a float sum's last bit)
    # the estimate's policy line says the same of its traces
    path = _write(tmp_path, run)
    assert main(["estimate", str(path), "--format", "json"]) == 0
    section = json.loads(capsys.readouterr().out)["spot_policy"]
    assert doc["source"] == section["trace_source"], (doc["source"], section["trace_source"])


# ---- 5. the cap to set across layouts that never settle -----------------------------------------------------------


def _layout(words: str) -> SimpleNamespace:
    """A stand-in estimate: a layout ('2 x ml.g6e.48xlarge'), as `_settled_layout` reads it."""
    count, kind = words.split(" x ")
    return SimpleNamespace(instance_type=kind, instance_count=int(count), sharding="full", shard_group_nodes=1)


def _row(label: str, p_deadline: float) -> dict:
    return {"label": label, "p_deadline": p_deadline, "p_finished": 1.0, "mean_usd": 100.0, "p95_usd": 120.0}


A, B, C, D = "2 x ml.g6e.48xlarge", "1 x ml.p5.48xlarge", "1 x ml.p4d.24xlarge", "2 x ml.g6e.24xlarge"


@pytest.mark.parametrize("ranked, caps, hops", [
    # A at its cap ($300) brings B; B's cap to set ($250) brings A: a cycle
    ({300.0: B, 250.0: A}, {B: 250.0}, [(A, 300.0, B), (B, 250.0, A)]),
    # A's brings B, B's C, C's D, past LAYOUT_SETTLE_TRIES (3): D is not ranked at its own cap
    ({300.0: B, 250.0: C, 220.0: D}, {B: 250.0, C: 220.0, D: 210.0},
     [(A, 300.0, B), (B, 250.0, C), (C, 220.0, D), (D, 210.0, None)]),
])
def test_layouts_that_never_settle_name_the_layout_and_odds_the_estimate_takes_at_the_cap_named(monkeypatch, ranked,
                                                                                                caps, hops):
    """Stand-in rankings (`replan`: the layout the estimate takes at a cap) and stand-in searches on each layout
    (`spot_policy_at_caps`: its chosen policy's row at the cap asked, and its own cap to set). Before, the loop
    returned None and A's cap was named with A's odds, while the estimate at that cap takes B."""
    from spotrun.policy import choose
    from spotrun.seams import SpotPolicy

    at_cap = {B: _row("deadline_greedy (notice)", 0.93), C: _row("uniform_progress (notice)", 0.9),
              D: _row("maxwait_fallback (notice)", 0.5)}  # each layout's chosen row at the cap it is ranked at
    proven = _row("deadline_greedy (notice)", 0.995)  # a layout's row at its own cap to set

    def search(run_at, there, _catalog, **_poll):
        words = f"{there.instance_count} x {there.instance_type}"
        row = at_cap[words]
        return SimpleNamespace(section=SimpleNamespace(
            chosen=row["label"], policies=[_row("on_demand", 1.0), row], cap_to_set_usd=caps.get(words),
            cap_to_set_row=proven, cap_to_set_least=True))

    monkeypatch.setattr(choose, "spot_policy_at_caps", search)
    run = parse_run(_run(SMALL, deadline_hours=12, on_demand_fallback=True))
    out = choose._settled_layout(run, _layout(A), {}, {}, 300.0, lambda cap: _layout(ranked[cap]))
    assert out is not None, "the layouts did not settle and nothing was said"
    cap, row, least, layout, said = out
    # true at the cap named: A's cap to set, at which the estimate takes B with B's odds there, not the least
    assert (cap, layout, least) == (300.0, B, False)
    assert row == at_cap[B]
    assert [(h["layout"], h["cap_to_set_usd"], h["brings"]) for h in said] == hops
    # and said: the cap to set's line names B, its odds at that cap, and that the layouts do not settle
    section = SpotPolicy(chosen="deadline_greedy (notice)", why="", p95_finish_cap_usd=300.0, confidence=0.99,
                         traces=1000, seed=0, trace_source="", policies=[], left_out=[], policy="deadline_greedy",
                         checkpointing="notice", sim_plan={"deadline_s": 12 * 3600.0}, cap_to_set_row=row,
                         cap_to_set_usd=cap, deadline_cap_usd=cap, cap_to_set_layout=layout,
                         cap_to_set_unsettled=said)
    line = choose.settings_lines(section)[-1]
    assert line.startswith("  the cap to set: $300.00"), line
    assert f"the cap to set searched on {A}, at which the estimate simulated at it chooses deadline_greedy " \
           f"(notice) on {B}" in line, line
    assert "meets the 12 h deadline on 93.0%" in line and "99.5%" not in line, line
    said_at = [line.find(f"{h[0]} (its cap to set ${h[1]:,.2f}") for h in hops]  # each layout in turn
    assert line.find("they do not settle: ") < said_at[0] and said_at == sorted(said_at), line
    assert line.count(f"{A} again") == (hops[-1][2] == A), line
    assert line.count(", not ranked at it)") == (hops[-1][2] is None), line
    assert "the least cap" not in line, line


# ---- 4. runs that end at the longest MaxRuntime: why, and what to do -----------------------------------------------


def test_runs_ended_at_the_longest_maxruntime_are_said_with_why_and_what_to_do_in_text_and_json():
    """The trial's 70B at a $5,000 cap: 'maxwait_fallback (periodic) finishes on 99.7% (0.3% ran to the longest
    MaxRuntime)' and nothing said why. The cause, here by hand: a spot job interrupted every 20 min never commits a
    save (every 30 min of work), and its billed seconds, restarts included, reach the longest MaxRuntime (20 h,
    from no cap) long before its MaxWait; the guard ends the run there. On capacity throughout it finishes."""
    from spotrun.planner.outputs import unfinished_text
    from spotrun.policy.engine import INF, SimPlan
    from spotrun.policy.report import study, table_text

    h = 3600.0
    plan = SimPlan(work_s=10 * h, startup_s=600.0, restore_s=0.0, save_s=60.0, interval_s=1800.0, step_s=10.0,
                   notice_ok=False, spot_usd_per_h=3.5, on_demand_usd_per_h=10.0, max_wait_s=60 * h,
                   max_runtime_s=20 * h, deadline_s=None, on_demand_fallback=True)
    choppy = [(k * 21 * 60.0, k * 21 * 60.0 + 20 * 60.0) for k in range(300)]  # 20 min up, 1 min down
    report = study(plan, [choppy, [(0.0, INF)]], [("maxwait_fallback", "periodic")], optimum=False)
    row = report["policies"][0]
    assert row["p_finished"] == 0.5 and row["p_over_budget"] == 0.0, row  # the case: one run ended, not by a cap
    said = report["longest_max_runtime"]
    assert said["max_runtime_s"] == 20 * h and said["ended"] == {row["label"]: 0.5}, said
    assert "counts every billed second, its restarts and the work its interruptions lost" in said["why"]
    assert "checkpoint.resume_from" in said["advice"] and "compute.spot=false" in said["advice"]
    text = table_text(report)
    assert f"ran to the longest MaxRuntime, 20.0 h, unfinished ({row['label']} 50.0%): {said['why']}; " \
           f"{said['advice']}" in text, text
    # the estimate's cost line says the same of its chosen row
    cost = unfinished_text(row, fallback=True)
    assert f"50.0% ran to the longest MaxRuntime unfinished ({said['why']}: {said['advice']})" in cost, cost
    # where every run finishes, nothing is said
    calm = study(plan, [[(0.0, INF)]], [("maxwait_fallback", "periodic")], optimum=False)
    assert calm["longest_max_runtime"] is None and "longest MaxRuntime" not in table_text(calm)
