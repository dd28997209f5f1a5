"""Fit the estimate's availability model (spotrun/policy/availability.py) to recorded spot capacity.

    python benchmarks/fit_availability.py --spot-traces DIR [--set choose]

Reads every one-node trace of github.com/skypilot-org/spot-traces (`availability/1-node/*/*.json` under DIR; not in
this repository), in sorted path order; `--set choose` (the default) keeps the traces at even positions, the
choose set of benchmarks/policy_bench.py, so that benchmarks/calibration_bench.py can report on the others. Each
trace is a sequence of cycles: a stretch with capacity that ended (an interruption) and the stretch without
capacity after it. Each stretch with capacity is taken times its own trace's interruption rate (the trace's
interruptions per available hour, as the interruption recorder measures a rate), each without over its own
trace's mean one, so that both have mean 1 and the estimate scales them by its own rate. Those are the HMM's
features; what the generator draws splits the stretches with capacity further: the short ones (at most
`SHORT_UP_S`, 15 minutes: the recordings' blips of a few samples, 13-49% of the stretches at every rate) are kept
in seconds, the others taken over their own trace's mean long one (mean 1), so that a run at a low rate keeps its
blips short instead of stretching them by 1 / rate.

The cycles' regimes: a two-state hidden Markov model over the cycles (Baum-Welch, Rabiner 1989), each state
drawing log(up) and log(down) from its own independent normals, the state kept from one cycle to the next with
its own probability; the most likely state sequence of each trace (Viterbi) labels every cycle. It prints, as
Python to paste into spotrun/policy/availability.py:
- per regime (the one with the longer waits first), `short`: the share of its labelled cycles whose stretch with
  capacity is short, `up_short`: those stretches' quantiles in seconds, `up`: the quantiles of its other stretches
  with capacity (over their trace's mean long one), `down`: of its waits, and `stay`: how often a cycle of that
  regime is followed by one of the same (the labels' counts);
- `DOWN_MEAN_AT_ONE_PER_HOUR_S`, `DOWN_RATE_EXPONENT`: c and beta of a trace's mean stretch without capacity
  = c x rate^beta (least squares on the logarithms over the traces): where capacity is interrupted more often it
  also takes longer to come back;
- `SHORT_FITTED_UP_TO_PER_HOUR`: the fastest trace's rate (the short stretches keep their seconds up to it);
  `SHORT_SHARE_AT_ONE_PER_HOUR`, `SHORT_SHARE_RATE_EXPONENT`: c and beta of a trace's share of short stretches
  = c x rate^beta (the same least squares): the regimes' shares are scaled to it at the run's rate.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spotrun.policy.availability import LEVELS, SHORT_UP_S  # noqa: E402
from spotrun.policy.traces import read_availability  # noqa: E402


def stretches(rec) -> tuple[float, float, list[float], list[float]]:
    """(interruptions per available hour, mean down in seconds, ups times the rate, downs over their mean): every
    cycle of the recording (a stretch with capacity and the one without after it), not wrapped."""
    ups = [b - a for a, b in rec.windows]
    rate = len(rec.windows) / sum(ups)
    downs = [a2 - b for (_, b), (a2, _) in zip(rec.windows, rec.windows[1:], strict=False)]
    mean_down = sum(downs) / len(downs)
    return rate * 3600, mean_down, [u * rate for u in ups[:len(downs)]], [d / mean_down for d in downs]


def blips(rec, short_s: float = SHORT_UP_S) -> tuple[list[bool], list[float], list[float]]:
    """Per cycle of the recording (as `stretches`), whether its stretch with capacity is short (at most `short_s`
    seconds, whatever the trace's rate); the short ones in seconds; the others over their own mean (mean 1)."""
    ups = [b - a for a, b in rec.windows[:-1]]
    short = [u <= short_s for u in ups]
    longs = [u for u in ups if u > short_s]
    mean_long = sum(longs) / len(longs)
    return short, [u for u in ups if u <= short_s], [u / mean_long for u in longs]


def power_law(rates: list[float], means: list[float]) -> tuple[float, float]:
    """(c, beta) of mean = c x rate^beta, least squares on the logarithms."""
    xs, ys = [math.log(r) for r in rates], [math.log(m) for m in means]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    beta = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return math.exp(my - beta * mx), beta


def quantiles(values: list[float], levels: tuple[float, ...]) -> list[float]:
    """The empirical quantiles at `levels` by linear interpolation between closest ranks."""
    xs = sorted(values)
    out = []
    for q in levels:
        pos = q * (len(xs) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
    return out


def _log_emissions(x: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """log density of each cycle (rows of logs) under each state's independent normals: (T, states)."""
    z = (x[:, None, :] - mu[None]) / sd[None]
    return -0.5 * (z ** 2).sum(-1) - np.log(sd).sum(-1)[None] - x.shape[1] * 0.5 * math.log(2 * math.pi)


def _forward_backward(x, start, trans, mu, sd):
    """Scaled forward-backward for one sequence: (state posteriors, summed transition posteriors, log-likelihood)."""
    b = np.exp(_log_emissions(x, mu, sd))
    alpha, scale = np.zeros_like(b), np.zeros(len(x))
    alpha[0] = start * b[0]
    for t in range(len(x)):
        if t:
            alpha[t] = (alpha[t - 1] @ trans) * b[t]
        scale[t] = alpha[t].sum()
        alpha[t] /= scale[t]
    beta = np.ones_like(b)
    for t in range(len(x) - 2, -1, -1):
        beta[t] = trans @ (b[t + 1] * beta[t + 1]) / scale[t + 1]
    gamma = alpha * beta
    xi = alpha[:-1, :, None] * trans[None] * (b[1:] * beta[1:])[:, None, :] / scale[1:, None, None]
    return gamma / gamma.sum(1, keepdims=True), xi.sum(0), float(np.log(scale).sum())


def fit_hmm(seqs: list[np.ndarray], iters: int = 500, tol: float = 1e-6):
    """Baum-Welch for a two-state HMM with independent normal emissions per state, over sequences of rows
    (cycles) of logs. Starts from a split at the median of the first column. Returns (start, trans, mu, sd, ll)."""
    rows = np.concatenate(seqs)
    low = rows[:, 0] < np.median(rows[:, 0])
    mu = np.array([rows[low].mean(0), rows[~low].mean(0)])
    sd = np.array([rows[low].std(0), rows[~low].std(0)])
    start, trans, prev = np.full(2, 0.5), np.array([[0.8, 0.2], [0.2, 0.8]]), -math.inf
    for _ in range(iters):
        g0, counts, w, s1, s2, ll = np.zeros(2), np.zeros((2, 2)), np.zeros(2), 0.0, 0.0, 0.0
        for x in seqs:
            gamma, xi, seq_ll = _forward_backward(x, start, trans, mu, sd)
            g0, counts, w, ll = g0 + gamma[0], counts + xi, w + gamma.sum(0), ll + seq_ll
            s1, s2 = s1 + gamma.T @ x, s2 + gamma.T @ x ** 2
        start, trans = g0 / g0.sum(), counts / counts.sum(1, keepdims=True)
        mu = s1 / w[:, None]
        sd = np.sqrt(np.maximum(s2 / w[:, None] - mu ** 2, 1e-6))
        if ll - prev < tol:
            break
        prev = ll
    return start, trans, mu, sd, ll


def viterbi(x: np.ndarray, trans: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """The most likely state of each cycle of one sequence (rows of logs); a uniform start."""
    logb, logt = _log_emissions(x, mu, sd), np.log(trans)
    v, back = logb[0].copy(), np.zeros((len(x), 2), dtype=int)
    for t in range(1, len(x)):
        s = v[:, None] + logt
        back[t], v = s.argmax(0), s.max(0) + logb[t]
    states = np.zeros(len(x), dtype=int)
    states[-1] = v.argmax()
    for t in range(len(x) - 2, -1, -1):
        states[t] = back[t + 1][states[t + 1]]
    return states


def regimes(seqs: list[np.ndarray], short: list[list[bool]] | None = None,
            raw_ups: list[list[float]] | None = None) -> list[dict]:
    """Per regime, the longer mean log-down first: its cycles' up and down quantiles and its stay probability,
    from the Viterbi labels of the fitted HMM (seqs: per trace, rows of (up, down) in mean-1 units). With
    `short` (per trace, per cycle: a short stretch with capacity) and `raw_ups` (per trace, per cycle: the short
    ones in seconds, the others over their trace's mean long one), also the regime's share of short stretches,
    their quantiles in seconds (`up_short`), and `up` the quantiles of the others (mean-1 units of long ones)."""
    logs = [np.log(s) for s in seqs]
    _, trans, mu, sd, _ = fit_hmm(logs)
    order = np.argsort(-mu[:, 1])
    labels = [np.argsort(order)[viterbi(x, trans, mu, sd)] for x in logs]
    rows, states = np.concatenate(seqs), np.concatenate(labels)
    out = []
    for k in range(2):
        pairs = [(a, b) for lab in labels for a, b in zip(lab[:-1], lab[1:], strict=True) if a == k]
        r = {"up": quantiles(list(rows[states == k, 0]), LEVELS),
             "down": quantiles(list(rows[states == k, 1]), LEVELS),
             "stay": sum(b == k for _, b in pairs) / len(pairs), "cycles": int((states == k).sum())}
        if short is not None and raw_ups is not None:
            cyc = [(s, u) for lab, sh, ups in zip(labels, short, raw_ups, strict=True)
                   for st, s, u in zip(lab, sh, ups, strict=True) if st == k]
            blips = [u for s, u in cyc if s]
            r.update(short=len(blips) / len(cyc), up_short=quantiles(blips, LEVELS),
                     up=quantiles([u for s, u in cyc if not s], LEVELS))
        out.append(r)
    return out


def _table(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in values) + ")"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spot-traces", type=Path, required=True, help="where skypilot-org/spot-traces is")
    parser.add_argument("--set", choices=["choose", "held-out", "all"], default="choose",
                        help="which traces: even positions (choose), odd (held-out) or all")
    args = parser.parse_args()
    paths = sorted(args.spot_traces.glob("availability/1-node/*/*.json"))
    if not paths:
        raise SystemExit(f"--spot-traces {args.spot_traces}: no availability/1-node/*/*.json under it")
    keep = {"choose": 0, "held-out": 1}.get(args.set)
    paths = [p for i, p in enumerate(paths) if keep is None or i % 2 == keep]
    seqs, rates, means, short, raw_ups, shares = [], [], [], [], [], []
    for p in paths:
        rec = read_availability(p)
        rate, mean_down, u, d = stretches(rec)
        rates.append(rate)
        means.append(mean_down)
        seqs.append(np.array([u, d]).T)
        flags, blip_s, longs = blips(rec)
        blip_it, long_it = iter(blip_s), iter(longs)
        short.append(flags)
        shares.append(sum(flags) / len(flags))
        raw_ups.append([next(blip_it) if f else next(long_it) for f in flags])
    c, beta = power_law(rates, means)
    share_c, share_beta = power_law(rates, shares)
    print(f"# {len(paths)} traces ({args.set}): {sum(map(len, seqs))} cycles; short stretches with capacity: "
          f"at most {SHORT_UP_S:g} s")
    print("REGIMES = (")
    for r in regimes(seqs, short, raw_ups):
        print(f"    Regime(stay={r['stay']:.4f}, short={r['short']:.4f},  # {r['cycles']} cycles\n"
              f"           up_short={_table(r['up_short'])},\n"
              f"           up={_table(r['up'])},\n           down={_table(r['down'])}),")
    print(")")
    print(f"DOWN_MEAN_AT_ONE_PER_HOUR_S = {c:.0f}")
    print(f"DOWN_RATE_EXPONENT = {beta:.3f}")
    print(f"SHORT_FITTED_UP_TO_PER_HOUR = {max(rates):.3g}")
    print(f"SHORT_SHARE_AT_ONE_PER_HOUR = {share_c:.3f}")
    print(f"SHORT_SHARE_RATE_EXPONENT = {share_beta:.3f}")


if __name__ == "__main__":
    main()
