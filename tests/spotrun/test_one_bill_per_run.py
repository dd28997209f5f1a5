"""What a user is told about one run is one quantity: the chain's bill, in the run's market (the cost row, the
policy table, the caps it names, the refusals, the deadline check), through the CLI and the estimate Lambda.

The figures compared are the estimate's own, read from its output, never recomputed here.
"""

from __future__ import annotations

import json
from pathlib import Path

from spotrun.pipeline.policy_stage import OVER_ON_DEMAND
from spotrun.policy.choose import AT_THIS_CAP

from .test_caps_keep_the_deadline import _plan, _qwen
from .test_new_users_trial import _cli, _lambda, _with

ROOT = Path(__file__).parents[2]


def _row(doc: dict, label: str) -> dict:
    return next(r for r in doc["spot_policy"]["policies"] if r["label"] == label)


def test_an_on_demand_run_shows_one_bill_in_the_cost_row_the_policy_table_and_the_caps(tmp_path, capsys,
                                                                                        monkeypatch):
    """`spot: false` (qwen2): the cost row said on-demand $0.74 (the chain: its start with the trainer's start, its
    end), the policy table's on-demand P95 $0.62 (the catalog's bare startup), and the cap to set was planned on
    the $0.62; the spot run of the same layout said on-demand $0.62 for the same job."""
    run = _qwen(spot=False)
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0, doc
    for told in (doc, _plan(monkeypatch, run)):
        shown = told["cost_usd"]["on_demand"]
        row = {k: round(v, 2) for k, v in _row(told, "on_demand").items() if k.endswith("_usd")}  # as printed
        assert row["mean_usd"] == row["p50_usd"] == row["p95_usd"] == told["spot_policy"]["p95_one_job_usd"] == shown
        # uninterrupted and deterministic: the cap to set is the chain's smallest cap, the same figure
        assert told["spot_policy"]["p95_finish_cap_usd"] == told["segments"]["min_cap_usd"] > shown, told
    _, spot_doc = _cli(tmp_path, capsys, "estimate", _qwen())
    assert spot_doc["cost_usd"]["on_demand"] == doc["cost_usd"]["on_demand"], (spot_doc["cost_usd"], doc["cost_usd"])
    # a cap under the bill is refused on that bill, naming the cap to set
    to_set = doc["spot_policy"]["p95_finish_cap_usd"]
    for cap in (round(doc["cost_usd"]["on_demand"] * 0.9, 2), round(to_set - 0.01, 2)):
        under = _with(run, budget={"max_usd": cap})
        code, refused = _cli(tmp_path, capsys, "estimate", under)
        out = _lambda(monkeypatch, under)
        assert (code, refused["error"], out["status"]) == (3, "OverBudget", "OverBudget"), (refused, out)
        for message in (refused["message"], out["message"]):
            assert f"${to_set:,.2f}" in message, message
    code, there = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": to_set}))
    assert code == 0 and there["spot_policy"]["p95_finish_cap_usd"] == to_set, there


def test_the_same_on_demand_bill_names_the_same_cap_to_set_with_spot_true_or_false(tmp_path, capsys, monkeypatch):
    """qwen2 with a 0.33 h deadline and on-demand fallback: the spot run chooses on_demand (the deadline policies
    go on-demand from the start), whose P95 is the spot=false run's bill. The cap to set was $1.28 with spot (the
    bill's seconds taken at the spot share, then raised for a spot chain's restart the on-demand run never has),
    $0.83 without."""
    told = {}
    for spot in (True, False):
        run = _with(_qwen(spot=spot, deadline_hours=0.33, on_demand_fallback=True),
                    checkpoint={"interruptions_per_hour": 2})
        code, doc = _cli(tmp_path, capsys, "estimate", run)
        assert code == 0, doc
        assert doc["spot_policy"]["chosen"] == "on_demand", doc["spot_policy"]
        for there in (doc, _plan(monkeypatch, run)):
            told.setdefault(spot, []).append((there["spot_policy"]["p95_one_job_usd"],
                                              there["spot_policy"]["p95_finish_cap_usd"]))
        cap = doc["spot_policy"]["p95_finish_cap_usd"]
        code, set_at = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": cap}))
        assert code == 0 and set_at["spot_policy"]["p95_finish_cap_usd"] == cap, set_at["spot_policy"]
        assert not [w for w in set_at["warnings"] if "deadline_hours" in w], set_at["warnings"]
    assert len(set(told[True] + told[False])) == 1, told


def test_a_deadline_shorter_than_the_job_as_billed_is_refused_and_accepted_only_loudly(tmp_path, capsys,
                                                                                        monkeypatch):
    """qwen2 takes 0.27 h by the wall time row and 0.32 h as one job billed (its start with the trainer's start,
    its end): a 0.3 h deadline was 'ok' and then met on 0.0% of the traces once simulated as billed."""
    run = _qwen(deadline_hours=0.3)
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    out = _lambda(monkeypatch, run)
    assert (code, doc["error"], out["status"]) == (2, "InvalidRun", "InvalidRun"), (doc, out)
    for message in (doc["message"], out["message"]):
        assert "compute.deadline_hours=0.3 cannot be met: the run takes 0.32 h" in message, message
        assert "compute.accept_missed_deadline=true" in message, message
    accepted = _with(run, compute={"accept_missed_deadline": True})
    code, doc = _cli(tmp_path, capsys, "estimate", accepted)
    assert code == 0, doc
    for told in (doc, _plan(monkeypatch, accepted)):
        assert told["warnings"][0].startswith("THE DEADLINE WILL BE MISSED: compute.deadline_hours=0.3, and the "
                                              "run takes 0.32 h"), told["warnings"]
    path = tmp_path / "accepted.json"
    path.write_text(json.dumps(accepted))
    from spotrun.cli.main import main
    assert main(["estimate", str(path)]) == 0
    text = capsys.readouterr().out
    assert "warning: THE DEADLINE WILL BE MISSED: " in text and "one uninterrupted job bills 0.32 h" in text, text


def test_an_automatic_layout_meets_the_deadline_when_one_can(tmp_path, capsys, monkeypatch):
    """`instance_type: auto` with `compute.deadline_hours` picked the cheapest layout whatever the deadline (only
    `target_hours` was honoured), and the run was then refused as too slow."""
    example = json.loads((ROOT / "examples/runs/llama3-8b-full.json").read_text())
    example["model"] = {"init": "random", "config": example["model"]["config"]}
    run = _with(example, compute={"instance_type": "auto", "spot": False}, budget={"max_usd": 5000})
    run["compute"].pop("instance_count", None)
    run["compute"].pop("accepted_delay_hours", None)  # spot only: refused with spot false
    code, cheapest = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0, cheapest
    hours = cheapest["wall_seconds"] / 3600
    timed = _with(run, compute={"deadline_hours": round(hours / 2, 1)})
    code, doc = _cli(tmp_path, capsys, "estimate", timed)
    assert code == 0, doc
    assert doc["wall_seconds"] / 3600 < round(hours / 2, 1), (doc["wall_seconds"], hours)
    assert doc["cost_usd"]["on_demand"] >= cheapest["cost_usd"]["on_demand"], (doc["cost_usd"], cheapest["cost_usd"])


def test_a_cap_far_above_the_run_is_named_against_the_estimate(tmp_path, capsys, monkeypatch):
    """A $5,000,000 cap on a $0.26 run was accepted without a word (without a stage); under the stage's maximum a
    $4,000 cap is still 5,000 times the run. Warned, naming the cap and the run's bill, by the CLI and the Lambda."""
    for cap in (4000, 5_000_000):
        run = _with(_qwen(), budget={"max_usd": cap})
        code, doc = _cli(tmp_path, capsys, "estimate", run)
        assert code == 0, doc
        told = [doc] if cap > 5000 else [doc, _plan(monkeypatch, run)]  # the stage refuses more than $5,000
        for there in told:
            said = [w for w in there["warnings"] if w.startswith(f"budget.max_usd=${cap:,.2f} is ") and "x the" in w]
            assert len(said) == 1 and f"(${there['cost_usd']['on_demand']:,.2f};" in said[0], there["warnings"]
    _, doc = _cli(tmp_path, capsys, "estimate", _qwen())  # the example's $50: no such word
    assert not [w for w in doc["warnings"] if "x the run's on-demand bill" in w], doc["warnings"]


def _table_row(label: str, mean: float, p95: float, p_deadline: float) -> dict:
    return {"label": label, "mean_usd": mean, "p50_usd": min(mean, p95), "p95_usd": p95, "p_deadline": p_deadline,
            "p_finished": 1.0, "mean_lost_h": 0.0, "mean_wall_h": 10.0, "mean_interruptions": 1.0}


def test_the_simulate_table_says_what_its_optimum_is_and_why_a_mean_is_over_its_p95():
    """`spotrun simulate` with a deadline printed 'exact optimum' over policies 35% below it (they miss the deadline
    the optimum must meet), and tables showed a mean above the P95 (a long tail, not a bug) without a word."""
    from spotrun.policy.report import table_text

    report = {"traces": 200, "source": "generated", "work_hours": 13.5, "deadline_hours": 16.0, "chosen": "b",
              "why": "cheapest meeting it", "policies": [_table_row("on_demand", 31.62, 31.62, 1.0),
                                                          _table_row("a", 15.85, 28.35, 0.045),
                                                          _table_row("b", 28.30, 27.10, 1.0)],
              "optimum": {"mean_usd": 24.68, "p50_usd": 26.35, "p95_usd": 31.62, "p_deadline": 1.0, "exact": True}}
    text = table_text(report)
    assert "optimum meeting the deadline" in text and "exact optimum" not in text, text
    assert "below the optimum: a: the optimum is the cheapest schedule that meets the deadline" in text, text
    # the row itself says why it is below the floor, and the rows that meet the deadline say nothing of it
    rows = {line[2:].split()[0]: line for line in text.splitlines()[2:5]}
    assert rows["a"].endswith("-35.8%  misses the deadline on 95.5%: below the optimum that meets it"), rows
    assert "misses the deadline" not in rows["b"] + rows["on_demand"], rows
    assert "mean above P95 (b): " in text, text
    calm = {**report, "policies": [_table_row("on_demand", 31.62, 31.62, 1.0), _table_row("b", 28.30, 29.0, 1.0)]}
    assert "below the optimum" not in table_text(calm) and "mean above P95" not in table_text(calm)
    no_deadline = {**report, "deadline_hours": None}  # the optimum is then no deadline's floor: nothing to say
    assert "misses the deadline" not in table_text(no_deadline), table_text(no_deadline)


def test_every_example_names_its_models_context_so_a_seq_len_beyond_it_is_refused(tmp_path, capsys):
    """The Qwen example's inline config had no max_position_embeddings: `seq_len: 100000` was caught only as out of
    memory. Each example carries its model's (Hugging Face config.json) and is refused one token past it."""
    for path in sorted((ROOT / "examples/runs").glob("*.json")):
        run = json.loads(path.read_text())
        limit = run["model"]["config"].get("max_position_embeddings")
        assert isinstance(limit, int), path.name
        code, doc = _cli(tmp_path, capsys, "estimate", _with(run, data={"seq_len": limit + 1}))
        assert (code, doc["field"]) == (2, "data.seq_len"), (path.name, doc)
        assert f"max_position_embeddings={limit:,}" in doc["message"] or \
            f"max_position_embeddings={limit}" in doc["message"], doc["message"]


def _text(tmp_path, capsys, run: dict) -> str:
    from spotrun.cli.main import main
    path = tmp_path / "text.json"
    path.write_text(json.dumps(run))
    assert main(["estimate", str(path)]) == 0
    return capsys.readouterr().out


def test_a_spot_policy_whose_p95_is_billed_on_demand_says_why_its_cap_is_above_the_on_demand_runs(
        tmp_path, capsys, monkeypatch):
    """qwen2 on spot with a 0.6 h deadline, on-demand fallback and 3 interruptions an hour: uniform_progress is
    chosen (it moves to on-demand when spot falls behind), its P95 trace billed on-demand in part, the P95 the
    spot=false run's bill. Its cap to set was several times the $0.83 the spot=false run is told for that same bill,
    without a word: the cap takes the bill at the spot share because a run billed within the P95 can bill it on spot
    (each second bounded at on-demand rates while its job runs). The line says so and names the on-demand figure,
    the spot=false run's own cap to set."""
    run = _with(_qwen(deadline_hours=0.6, on_demand_fallback=True), checkpoint={"interruptions_per_hour": 3})
    _, on_demand = _cli(tmp_path, capsys, "estimate", _with(run, compute={"spot": False}))
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0, doc
    section = doc["spot_policy"]
    assert section["chosen"] != "on_demand" and section["policy"] != "on_demand", section["chosen"]
    row = _row(doc, section["chosen"])
    assert 0 < row["mean_spot_usd"] and 0 < row["mean_on_demand_usd"], row  # both markets on some traces
    bill = on_demand["cost_usd"]["on_demand"]
    assert section["p95_one_job_usd"] == on_demand["spot_policy"]["p95_one_job_usd"] == bill, (section, bill)
    part = section["p95_one_job_on_demand_usd"]
    assert 0 < part <= bill, section  # its P95 trace billed on-demand, all or in part
    on_demand_cap, to_set = on_demand["spot_policy"]["p95_finish_cap_usd"], section["p95_finish_cap_usd"]
    assert section["p95_on_demand_finish_cap_usd"] == on_demand_cap < to_set, section
    assert _plan(monkeypatch, run)["spot_policy"]["p95_on_demand_finish_cap_usd"] == on_demand_cap
    line = next(x for x in _text(tmp_path, capsys, run).splitlines() if "the cap to set:" in x)
    # with a deadline the cap to set is the least proven on simulations at it (tests/spotrun/test_cap_to_set_proven.py):
    # the line says so, with the odds there, instead of deriving it from the P95 bill's markets
    assert line.startswith(f"  the cap to set: ${to_set:,.2f} ({AT_THIS_CAP}): the least cap, to the cent, at "
                           f"which the estimate simulated at it chooses {section['chosen']} and it meets the 0.6 h "
                           "deadline on "), line
    # set, it holds: accepted, the same cap named, no word that it is under the cap to set or misses the deadline
    code, there = _cli(tmp_path, capsys, "estimate", _with(run, budget={"max_usd": to_set}))
    assert code == 0 and there["spot_policy"]["p95_finish_cap_usd"] == to_set, there["spot_policy"]
    # (the one word on it allowed: that it is over the on-demand bill, with what bounds the run lower, #26)
    assert not [w for w in there["warnings"] if ("cap to set" in w and OVER_ON_DEMAND not in w)
                or "deadline_hours" in w], there["warnings"]


def test_an_on_demand_run_labels_the_bill_to_expect_and_the_cap_to_set(tmp_path, capsys, monkeypatch):
    """`spot: false` (qwen2): the cost row's $0.74 and the $0.83 to set were both 'on-demand' figures without a word
    on which is the bill, the cap line spoke of a chain's restarts the one on-demand job never has, and the JSON's
    one-job bound (`segments.on_demand_bound_usd`, $0.69) was under the bill the same job is planned at."""
    run = _qwen(spot=False)
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0, doc
    bill, to_set = doc["cost_usd"]["on_demand"], doc["spot_policy"]["p95_finish_cap_usd"]
    assert bill < doc["segments"]["on_demand_bound_usd"] <= to_set, (bill, doc["segments"], to_set)
    text = _text(tmp_path, capsys, run)
    assert (f"cost                  on-demand ${bill:,.2f} (planned: one job, its start and end; the bill to expect, "
            "the cap to set is the spot policy's last line)") in text, text
    line = next(x for x in text.splitlines() if "the cap to set:" in x)
    assert line == (f"  the cap to set: ${to_set:,.2f} ({AT_THIS_CAP}) finishes at on_demand's P95 bill "
                    f"(${bill:,.2f} as one job; on-demand, the bill to expect): the cap also holds what the job's "
                    "MaxRuntime leaves unbilled at on-demand rates, its save and the 120 s a stop bills; simulated at "
                    "it, the estimate "
                    f"chooses on_demand and its runs finish on 100.0% (mean bill there ${bill:,.2f}, P95 "
                    f"${bill:,.2f}; the cap holds the finish share)"), line
    assert doc["spot_policy"]["cap_to_set_holds"] == ["finish share"], doc["spot_policy"]  # (no deadline)
    assert doc["spot_policy"]["p95_one_job_on_demand_usd"] == doc["spot_policy"]["p95_one_job_usd"] == bill


def test_a_spot_run_choosing_on_demand_is_not_told_of_a_spot_chain_at_the_cap_to_set(tmp_path, capsys,
                                                                                       monkeypatch):
    """qwen2 on spot with a 0.45 h deadline: on_demand is chosen, and its cap to set carries one on-demand job. The
    line went on 'the run is one job from a cap of $0.99: expected $0.31 there, $0.43 as the chain of 2 jobs at
    $0.83': the spot chain's jobs, which the on-demand run never runs."""
    run = _with(_qwen(deadline_hours=0.45, on_demand_fallback=True), checkpoint={"interruptions_per_hour": 3})
    code, doc = _cli(tmp_path, capsys, "estimate", run)
    assert code == 0 and doc["spot_policy"]["chosen"] == "on_demand", doc
    for told in (doc, _plan(monkeypatch, run)):
        section = told["spot_policy"]
        assert section["cap_to_set_jobs"] is None and section["one_job_cap_usd"] is None, section
    line = next(x for x in _text(tmp_path, capsys, run).splitlines() if "the cap to set:" in x)
    assert "as the chain of" not in line and "one job from a cap" not in line, line
