"""A run refused for its deadline's odds (no policy meets it on choose.CONFIDENCE at any cap, not accepted:
spotrun/pipeline/policy_stage.py `deadline_odds_refusal`) is refused without the search of a cap to set, which the
refusal never says: a 27-day run at 0.05 interruptions per hour with a 28.5-day deadline and no fallback took 57 s
of CPU of the estimate Lambda's 60 s, 31 s without that search (`benchmarks/estimate_lambda_bench.py --worst`).
The party checked is the estimate that searches them: its refusal, word for word and field for field, but for the
caps it searched (in the refusal's JSON estimate, never in its message), which the refusal leaves out."""

from __future__ import annotations

import json
from pathlib import Path

from spotrun.cli.main import main
from spotrun.policy import choose

ROOT = Path(__file__).parents[2]


def _refusal(tmp_path: Path, capsys, monkeypatch, *, full: bool) -> tuple[dict, dict]:
    run = json.loads((ROOT / "examples/runs/mistral-7b-lora.json").read_text())
    run["compute"].update({"deadline_hours": 3, "on_demand_fallback": False})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    calls = {"_settled_cap": 0, "_deadline_odds_kept": 0}
    for name in calls:
        real = getattr(choose, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(choose, name, counted)
    if full:  # the estimate as it ran before: every cap searched, then refused
        at_caps = choose.spot_policy_at_caps
        monkeypatch.setattr(choose, "spot_policy_at_caps",
                            lambda *a, **k: at_caps(*a, **{**k, "refused": False}))
    code = main(["estimate", "--format", "json", str(path)])
    doc = json.loads(capsys.readouterr().out)
    monkeypatch.undo()
    assert code != 0 and doc["error"] == "InvalidRun" and doc["field"] == "compute.deadline_hours", doc
    return doc, calls


def test_a_deadline_refusal_searches_no_cap_to_set_and_says_what_the_full_search_said(tmp_path, capsys,
                                                                                    monkeypatch):
    fast, searched = _refusal(tmp_path, capsys, monkeypatch, full=False)
    slow, searched_full = _refusal(tmp_path, capsys, monkeypatch, full=True)
    assert sum(searched_full.values()) > 0, searched_full  # the full estimate searches a cap for this run
    assert searched == {"_settled_cap": 0, "_deadline_odds_kept": 0}, searched
    # the refusal's JSON carries the estimate's section: the same but for the caps searched, which it leaves out
    caps = {"cap_to_set_usd": None, "p95_finish_cap_usd": None, "cap_to_set_row": None, "cap_to_set_holds": None,
            "cap_to_set_least": False}
    section = fast["estimate"]["spot_policy"]
    assert {key: section[key] for key in caps} == caps, section
    assert slow["estimate"]["spot_policy"]["cap_to_set_usd"] is not None, slow["estimate"]["spot_policy"]
    slow["estimate"]["spot_policy"].update(caps)
    assert fast == slow
