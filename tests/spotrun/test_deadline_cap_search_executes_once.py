"""Issue #26: the estimate inside the Lambda's 60 s. With a deadline, the search of the cap to set
(spotrun/policy/choose.py `_settled_cap`) executed the chosen policy on every trace at every cap it tried, and the
full check at the cap it ended on executed that policy again where a later cap tried had replaced it in the
store: a 70B LoRA refusal (auto layout, 30 h deadline, $500) took 52 s of CPU, a whole policy's 1,000 traces made
twice. A cap at which too many runs miss the deadline now fails on the traces likeliest to miss, executed first
(`_Unfinished.too_many`: exactly, the row there would be short whatever the other traces do), and no (plan,
policy, checkpointing) is executed twice on one trace (`compare` keeps every plan's executions: EVERY_PLAN)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from spotrun.cli.main import main
from spotrun.policy import choose, execution

QWEN2 = Path(__file__).resolve().parents[2] / "examples" / "runs" / "qwen2-0.5b-full-small.json"


def _qwen2_with_deadline(tmp_path: Path, **compute) -> Path:
    """The qwen2 example with a 0.4 h deadline (0.32 h uninterrupted on on-demand): the cap to set is searched to
    the cent on simulations at it, with the deadline's odds."""
    doc = json.loads(QWEN2.read_text())
    doc["compute"].update({"deadline_hours": 0.4, **compute.pop("compute", {})})
    doc["budget"].update(compute)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("changes, outcome", [
    # accepted at $50 (its 92.6% accepted: the deadline's odds refusal is not the case): the cap to set searched with
    # the deadline (main: 1,000 executions made twice)
    ({"compute": {"accept_missed_deadline": True}}, "ok"),
    ({"compute": {"instance_type": "auto"}, "max_usd": 0.5}, "OverBudget"),  # refused, naming its caps (2,000)
])
def test_no_plan_policy_and_trace_is_executed_twice_with_a_deadline(tmp_path, capsys, monkeypatch, changes,
                                                                     outcome):
    made = Counter()
    real = execution.execute

    def counting(plan, trace, policy, ck, **kw):
        if trace is not execution.UNINTERRUPTED:
            made[plan, policy, ck, id(trace)] += 1
        return real(plan, trace, policy, ck, **kw)

    monkeypatch.setattr(execution, "execute", counting)
    main(["estimate", "--format", "json", str(_qwen2_with_deadline(tmp_path, **changes))])
    doc = json.loads(capsys.readouterr().out)
    assert doc.get("status", doc.get("error")) == outcome, doc.get("message")
    section = doc.get("estimate", doc)["spot_policy"]  # (a refusal's: the estimate at the smallest cap it names)
    assert section["cap_to_set_usd"], section  # the case: a cap to set searched
    assert len(made) > 1000
    twice = [k for k, times in made.items() if times > 1]
    assert twice == [], f"{len(twice)} (plan, policy, checkpointing, trace) executed more than once"


def test_a_cap_that_misses_the_deadline_fails_early_and_exactly(tmp_path, capsys, monkeypatch):
    """Every cap the search fails on the deadline's traces alone is one at which the chosen policy's row,
    simulated on every trace, meets the deadline on fewer than the share needed; and some cap fails on fewer than
    all the traces (the saving)."""
    calls = []
    real_too_many, real_executed = choose._Unfinished.too_many, choose.executed

    def recording(self, at):
        executed = [0]

        def counting(plan, traces, *args):
            executed[0] += len(traces)
            return real_executed(plan, traces, *args)

        monkeypatch.setattr(choose, "executed", counting)
        try:
            fails = real_too_many(self, at)
        finally:
            monkeypatch.setattr(choose, "executed", real_executed)
        calls.append((self, at, fails, executed[0]))
        return fails

    monkeypatch.setattr(choose._Unfinished, "too_many", recording)
    # accepted (92.6%): refused, it searches no cap (test_deadline_refusal_searches_no_cap.py)
    run = _qwen2_with_deadline(tmp_path, compute={"accept_missed_deadline": True})
    main(["estimate", "--format", "json", str(run)])
    capsys.readouterr()
    searched = [c for c in calls if c[0].deadline]
    failed = [c for c in searched if c[2]]
    assert failed and any(0 < n < c.n for c, _, _, n in failed), [(at, fails, n) for _, at, fails, n in searched]
    for search, at, _, _ in failed:
        row = choose._simulated(*choose._at_cap(search.run, search.est, at), search.catalog, [search.candidate],
                                **search.sim)[1][0]
        assert row.p_deadline < search.need, (at, row.p_deadline, search.need)
