"""What the estimate's out-of-sample calibration error at a cap is made of, from benchmarks/calibration_bench.py's
`--cells` files (no run of its own: arithmetic on the runs those files hold).

    python benchmarks/calibration_residuals.py CELLS.json [CELLS_SEED1.json ...] [--show all]

Each file holds, per deadline and candidate, every recording's estimate (the means over its generated runs:
P(deadline), finished late, ended at the cap, bill, on-demand and spot hours, hours to finish) and every window's
executed run (the same figures, one run). The first file is the one reported; the others (the same runs with the
estimate's traces drawn from other seeds) give the estimate's seed-to-seed spread.

- `cells`: per deadline and candidate, estimated minus observed P(deadline) in points, pooled over the windows; the
  standard error of the observed frequency as binomial (windows independent) and clustered by recording (windows of
  one recording overlap and share its spells: the error the recordings allow); the mean, mean absolute and largest.
- `recordings`: per recording, its windows and its share of the pooled error (points of the 12-cell mean it
  carries: its windows' summed difference over all the windows), largest first.
- `parts`: per cell, estimated / observed: finished by the deadline, finished after it, ended at the cap, neither
  (still running or stopped at the horizon), the mean bill, on-demand hours, spot hours, hours to finish.
- `corrected`: a bias correction fitted inside each fold: recording r's estimate less the mean difference of the
  other 16 recordings' windows (their own leave-one-out residuals, never r's), per cell (`cell`) or one figure over
  every cell of the cap (`pooled`), or (`odds`) r's odds of missing scaled by the other 16's observed / estimated
  misses; the corrected cells against the uncorrected.
- `seeds` (with several files): per cell, the estimated P(deadline) at each seed, their spread, the binomial
  standard error of the estimate's own N traces per recording pooled over the windows, and estimated minus observed
  at each seed and its mean over the seeds; the mean and the largest of those seed means over the cells.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

PARTS = ("met", "late", "ended")
FIGURES = ("bill", "od_h", "spot_h", "finish_h")
CORRECTIONS = ("cell", "pooled", "odds")


def load(path: Path) -> dict:
    """A `--cells` file, refused by name if it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"{path}: not a calibration_bench.py --cells file ({e.__class__.__name__}: cannot read "
                         "it as JSON)") from None
    if not isinstance(data, dict) or not {"recordings", "deadlines", "n"} <= data.keys():
        raise SystemExit(f"{path}: not a calibration_bench.py --cells file (no recordings, deadlines and n)")
    return data


def cells(data: dict) -> list[tuple[str, str, list[tuple[int, float, dict]], list[dict]]]:
    """(deadline, candidate, windows as (recording, its estimate's P(deadline), the executed run's figures),
    the estimates per recording) for every cell of a `--cells` file."""
    out = []
    for deadline, by_label in data["deadlines"].items():
        for label, cell in by_label.items():
            est = cell["estimated"]
            out.append((deadline, label, [(i, est[i]["met"], f) for i, f in cell["windows"]], est))
    return out


def difference(windows: list[tuple[int, float, dict]], shift=None) -> float:
    """Estimated minus observed P(deadline) over `windows`, in points; `shift(recording, p)`: the estimate as
    corrected."""
    total = sum((p if shift is None else shift(i, p)) - f["met"] for i, p, f in windows)
    return 100 * total / len(windows)


def clustered_se(values: list[tuple[int, float]]) -> float:
    """The standard error of the mean of `values` (recording, value) with each recording's values one cluster
    (the sandwich estimate, scaled by G / (G - 1) for G recordings): windows of one recording overlap and share
    its spells, so they are not independent."""
    n = len(values)
    mean = sum(v for _, v in values) / n
    sums: dict[int, float] = {}
    for i, v in values:
        sums[i] = sums.get(i, 0.0) + v - mean
    g = len(sums)
    return math.sqrt(g / (g - 1) * sum(s * s for s in sums.values())) / n if g > 1 else float("nan")


def standard_errors(windows: list[tuple[int, float, dict]]) -> tuple[float, float, float]:
    """In points: the binomial standard error of the pooled observed frequency (windows independent), that
    frequency's clustered by recording, and the estimated-minus-observed difference's clustered by recording."""
    n = len(windows)
    q = sum(f["met"] for _, _, f in windows) / n
    return (100 * math.sqrt(q * (1 - q) / n), 100 * clustered_se([(i, f["met"]) for i, _, f in windows]),
            100 * clustered_se([(i, p - f["met"]) for i, p, f in windows]))


def summary(diffs: list[float]) -> str:
    """Mean, mean absolute and largest of cells' differences, in points."""
    largest = max(diffs, key=abs)
    return (f"{sum(diffs) / len(diffs):+.2f} | {sum(map(abs, diffs)) / len(diffs):.2f} | {largest:+.1f} | "
            f"{sum(abs(d) <= 1.0 for d in diffs)} of {len(diffs)}")


def per_recording_error(windows: list[tuple[int, float, dict]], shift=None) -> float:
    """The mean over windows of the absolute difference of their recording's own cell (estimated minus observed
    over its windows), in points: the error a pooled cell hides when recordings' errors cancel."""
    by_rec: dict[int, list] = {}
    for w in windows:
        by_rec.setdefault(w[0], []).append(w)
    return sum(len(ws) * abs(difference(ws, shift)) for ws in by_rec.values()) / len(windows)


def drop(data: dict, names: list[str]) -> dict:
    """`data` without the windows of recordings `names` (refused by name if not among its recordings)."""
    unknown = [n for n in names if n not in data["recordings"]]
    if unknown:
        raise SystemExit(f"--drop {','.join(unknown)}: not a recording of the cells file (names as DIR/stem, e.g. "
                         f"{data['recordings'][0]})")
    gone = {data["recordings"].index(n) for n in names}
    return {**data, "deadlines": {d: {lab: {**c, "windows": [w for w in c["windows"] if w[0] not in gone]}
                                      for lab, c in by_label.items()} for d, by_label in data["deadlines"].items()}}


def cell_rows(data: dict) -> list[str]:
    rows = ["| deadline | candidate | windows | estimated | observed | difference (points) | SE: binomial | "
            "clustered by recording | difference, clustered |", "|---|---|---|---|---|---|---|---|---|"]
    diffs = []
    for deadline, label, windows, _ in cells(data):
        est = sum(p for _, p, _ in windows) / len(windows)
        obs = sum(f["met"] for _, _, f in windows) / len(windows)
        se = standard_errors(windows)
        diffs.append(difference(windows))
        rows.append(f"| {deadline} h | {label} | {len(windows)} | {est:.1%} | {obs:.1%} | {diffs[-1]:+.1f} | "
                    f"{se[0]:.1f} | {se[1]:.1f} | {se[2]:.1f} |")
    rows += ["", "| cells | mean (points) | mean absolute | largest | within 1 point |", "|---|---|---|---|---|",
             f"| {len(diffs)} | {summary(diffs)} |"]
    return rows


def recording_rows(data: dict) -> list[str]:
    """Per recording: its windows (at the first deadline), the points of the cells' mean difference it carries, and
    its own difference per deadline (its windows only, the candidates' mean)."""
    all_cells = cells(data)
    deadlines = list(data["deadlines"])
    share: dict[int, float] = {}
    own: dict[tuple[int, str], list[float]] = {}
    for deadline, _, windows, _ in all_cells:
        for i, p, f in windows:
            share[i] = share.get(i, 0.0) + 100 * (p - f["met"]) / len(windows) / len(all_cells)
        for i in {i for i, _, _ in windows}:
            own.setdefault((i, deadline), []).append(difference([w for w in windows if w[0] == i]))
    first = all_cells[0][2]
    rows = ["| recording | windows | share of the mean (points) | " + " | ".join(f"own, {d} h" for d in deadlines)
            + " |", "|---|---|---|" + "---|" * len(deadlines)]
    for i in sorted(share, key=lambda k: -abs(share[k])):
        own_cells = [f"{sum(own[i, d]) / len(own[i, d]):+.1f}" if (i, d) in own else "-" for d in deadlines]
        rows.append(f"| {data['recordings'][i]} | {sum(1 for w in first if w[0] == i)} | {share[i]:+.2f} | "
                    + " | ".join(own_cells) + " |")
    rows.append(f"| all {len(data['recordings'])} | {len(first)} | {sum(share.values()):+.2f} | | | |")
    return rows


def part_rows(data: dict) -> list[str]:
    rows = ["| deadline | candidate | met | finished late | ended at the cap | neither | bill | on-demand h | spot h "
            "| hours to finish |", "|---|---|---|---|---|---|---|---|---|---|"]
    for deadline, label, windows, est in cells(data):
        def mean(key, side, windows=windows, est=est):
            vals = [(f if side == "obs" else est[i])[key] for i, _, f in windows]
            vals = [v for v in vals if v is not None]
            return sum(vals) / len(vals) if vals else float("nan")
        shares = {k: (mean(k, "est"), mean(k, "obs")) for k in PARTS}
        neither = tuple(1 - sum(shares[k][s] for k in PARTS) for s in (0, 1))
        cells_ = [f"{e:.1%} / {o:.1%}" for e, o in [*shares.values(), neither]]
        cells_ += [f"${mean('bill', 'est'):.2f} / ${mean('bill', 'obs'):.2f}"]
        cells_ += [f"{mean(k, 'est'):.2f} / {mean(k, 'obs'):.2f}" for k in FIGURES[1:]]
        rows.append(f"| {deadline} h | {label} | " + " | ".join(cells_) + " |")
    return rows


def correction(all_cells: list, kind: str, held_out: int, deadline: str, label: str):
    """The estimate's correction for recording `held_out` in one cell, fitted on the other recordings' windows
    only: a function (recording, p) -> corrected p."""
    def others(ws):
        return [w for w in ws if w[0] != held_out]
    if kind == "pooled":
        pairs = [(p, f["met"]) for _, _, ws, _ in all_cells for _, p, f in others(ws)]
    else:
        pairs = [(p, f["met"]) for d, lab, ws, _ in all_cells if (d, lab) == (deadline, label)
                 for _, p, f in others(ws)]
    if kind == "odds":
        est_miss = sum(1 - p for p, _ in pairs)
        ratio = sum(1 - m for _, m in pairs) / est_miss if est_miss > 0 else 1.0
        return lambda i, p: max(0.0, 1 - (1 - p) * ratio)
    bias = sum(p - m for p, m in pairs) / len(pairs)
    return lambda i, p: min(1.0, max(0.0, p - bias))


def corrected_rows(data: dict) -> list[str]:
    all_cells = cells(data)
    rows = ["| deadline | candidate | uncorrected | " + " | ".join(CORRECTIONS) + " |",
            "|---|---|---|" + "---|" * len(CORRECTIONS)]
    diffs: dict[str, list[float]] = {k: [] for k in ("none", *CORRECTIONS)}
    own: dict[str, list[float]] = {k: [] for k in diffs}
    for deadline, label, windows, _ in all_cells:
        diffs["none"].append(difference(windows))
        own["none"].append(per_recording_error(windows))
        fitted = {kind: {i: correction(all_cells, kind, i, deadline, label) for i in {w[0] for w in windows}}
                  for kind in CORRECTIONS}
        for kind in CORRECTIONS:
            diffs[kind].append(difference(windows, lambda i, p, f=fitted[kind]: f[i](i, p)))
            own[kind].append(per_recording_error(windows, lambda i, p, f=fitted[kind]: f[i](i, p)))
        rows.append(f"| {deadline} h | {label} | " + " | ".join(f"{diffs[k][-1]:+.1f}" for k in diffs) + " |")
    rows += ["", "| correction | cells | mean (points) | mean absolute | largest | within 1 point | each recording's "
             "own cell, mean absolute |", "|---|---|---|---|---|---|---|"]
    rows += [f"| {k} | {len(v)} | {summary(v)} | {sum(own[k]) / len(own[k]):.2f} |" for k, v in diffs.items()]
    return rows


def seed_rows(datas: list[dict]) -> list[str]:
    """Per cell: the estimated P(deadline) at each file's seed, their standard deviation, the binomial standard
    error of the estimate's N traces per recording, pooled over the windows (each recording's estimate weighted by
    its windows), and estimated minus observed at each seed and its mean over the seeds; then the mean and the
    largest of those seed means over the cells (what one seed's cells would state with that seed's luck)."""
    seeds = " ".join(str(d.get("seed")) for d in datas)
    rows = [f"| deadline | candidate | estimated at seeds {seeds} | spread (SD, points) | SE of N traces, pooled "
            f"(points) | difference at seeds {seeds} (points) | mean over the seeds |", "|---|---|---|---|---|---|---|"]
    per_file = [cells(d) for d in datas]
    means = []
    for k, (deadline, label, windows, est) in enumerate(per_file[0]):
        ps = [sum(p for _, p, _ in c[k][2]) / len(c[k][2]) for c in per_file]
        mean = sum(ps) / len(ps)
        sd = math.sqrt(sum((p - mean) ** 2 for p in ps) / (len(ps) - 1))
        counts: dict[int, int] = {}
        for i, _, _ in windows:
            counts[i] = counts.get(i, 0) + 1
        n_w = len(windows)
        var = sum((c / n_w) ** 2 * est[i]["met"] * (1 - est[i]["met"]) / datas[0]["n"] for i, c in counts.items())
        diffs = [difference(c[k][2]) for c in per_file]
        means.append(sum(diffs) / len(diffs))
        rows.append(f"| {deadline} h | {label} | " + " ".join(f"{p:.1%}" for p in ps)
                    + f" | {100 * sd:.2f} | {100 * math.sqrt(var):.2f} | "
                    + " ".join(f"{d:+.1f}" for d in diffs) + f" | {means[-1]:+.2f} |")
    rows += ["", f"| cells | mean over the seeds {seeds}: mean (points) | mean absolute | largest | within 1 point |",
             "|---|---|---|---|---|", f"| {len(means)} | {summary(means)} |"]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", type=Path, nargs="+", help="calibration_bench.py --cells files: the first "
                        "reported, the others the same runs at other seeds (--seed)")
    parser.add_argument("--show", choices=["all", "cells", "recordings", "parts", "corrected", "seeds"],
                        default="all", help="which table (default: all)")
    parser.add_argument("--drop", help="comma-separated recordings (DIR/stem) whose windows every table leaves out")
    args = parser.parse_args(argv)
    datas = [load(p) for p in args.cells]
    if args.drop:
        datas = [drop(d, args.drop.split(",")) for d in datas]
    shape = [(d, sorted(lab)) for d, lab in datas[0]["deadlines"].items()]
    for path, data in zip(args.cells[1:], datas[1:], strict=True):
        if [(d, sorted(lab)) for d, lab in data["deadlines"].items()] != shape or \
                data["recordings"] != datas[0]["recordings"]:
            parser.error(f"{path}: not the same recordings, deadlines and candidates as {args.cells[0]}")
    tables = {"cells": cell_rows, "recordings": recording_rows, "parts": part_rows, "corrected": corrected_rows}
    for name, rows in tables.items():
        if args.show in ("all", name):
            print(f"{name}:\n" + "\n".join(rows(datas[0])) + "\n")
    if args.show in ("all", "seeds"):
        if len(datas) < 2:
            if args.show == "seeds":
                parser.error("--show seeds needs two or more files (the same runs at other --seed)")
        else:
            print("seeds:\n" + "\n".join(seed_rows(datas)))


if __name__ == "__main__":
    sys.exit(main())
