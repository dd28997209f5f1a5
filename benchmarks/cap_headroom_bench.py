"""The cap to set and the cap with headroom (spotrun/policy/headroom.py), judged on draws they were not fitted on.

For each example run (examples/runs/*.json as they are, and each with a deadline instead of its accepted delay:
`DEADLINES`), `spotrun estimate`'s path (spotrun/cli/estimate.py `check_file`) names the cap to set (the least cap
at which the estimate's own traces, seed 0, keep the chosen policy's odds) and the cap with headroom (the least
at which that policy keeps them on seed 1 with a trainer 10% slower); this prints both and the chosen policy's odds
at each on held-out seeds `HELD_OUT` (3 and 4, at the planned speed): neither cap was searched on them. 1,000
traces read a share near 99% to about 0.3 points, so a held-out draw may read a few tenths under the odds kept.

    python benchmarks/cap_headroom_bench.py [--only NAME]

One Markdown row per case; also the estimate's CPU seconds and the headroom's share of them (its simulations).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from spotrun.cli.estimate import check_file
from spotrun.planner.catalog import load_catalog, regional_catalog
from spotrun.planner.estimate import DEFAULT_PRICE_REGION
from spotrun.policy.headroom import ChosenRows, cap_to_set_headroom

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples/runs").glob("*.json"))
# a deadline per example (compute.deadline_hours instead of its accepted delay): llama3's is the new user's trial's
DEADLINES = {"llama3-8b-full": 6.0, "mistral-7b-lora": 8.0, "qwen2-0.5b-full-small": 0.5}
HELD_OUT = (3, 4)


def cases(folder: Path) -> list[tuple[str, Path]]:
    out = []
    for path in EXAMPLES:
        out.append((f"{path.stem}, no deadline", path))
        if path.stem in DEADLINES:
            doc = json.loads(path.read_text())
            doc["compute"].pop("accepted_delay_hours", None)
            doc["compute"]["deadline_hours"] = DEADLINES[path.stem]
            there = folder / f"{path.stem}-deadline.json"
            there.write_text(json.dumps(doc))
            out.append((f"{path.stem}, {DEADLINES[path.stem]:g} h deadline", there))
    return out


def row(name: str, path: Path) -> str:
    start = time.process_time()
    checked = check_file(path, None, plan=True)
    cpu = time.process_time() - start
    est = checked.estimate
    section = est.spot_policy
    found = section.cap_to_set_headroom if section else None
    if found is None:
        return f"| {name} | {section and section.cap_to_set_usd} | (no headroom: none proven on this layout) |"
    again = time.process_time()  # the headroom's own time: the same search once more
    cap_to_set_headroom(checked.run, est, regional_catalog(load_catalog(), DEFAULT_PRICE_REGION))
    extra = time.process_time() - again
    proven = section.cap_to_set_row
    rows = ChosenRows(checked.run, est, regional_catalog(load_catalog(), DEFAULT_PRICE_REGION),
                      (proven["policy"], proven["checkpointing"]), {"poll_s": 60.0, "max_poll_s": 4 * 3600.0,
                                                                   "n": section.traces})
    key = found["odds"]

    def held(cap: float | None) -> str:
        if cap is None:
            return "-"
        return " / ".join(f"{getattr(rows.at(cap, seed), key):.1%}" for seed in HELD_OUT)

    least, room = found["cap_usd"], found["headroom_cap_usd"]
    room_text = "none found" if room is None else f"${room:,.2f}"
    return (f"| {name} | {proven['label']} | {'P(deadline)' if key == 'p_deadline' else 'P(finished)'} "
            f"{found['kept']:.1%} | ${least:,.2f} | {held(least)} | {room_text} | {held(room)} | "
            f"{cpu:.1f} s ({extra:.1f} s) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="the cases whose name contains this")
    args = parser.parse_args()
    print(f"| run | chosen policy | odds kept | least cap | its odds, seeds {'/'.join(map(str, HELD_OUT))} | "
          f"headroom cap | its odds, seeds {'/'.join(map(str, HELD_OUT))} | estimate CPU (headroom) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, path in cases(Path(folder)):
            if args.only and args.only not in name:
                continue
            print(row(name, path), flush=True)


if __name__ == "__main__":
    main()
