"""Fit the estimate's availability model (spotrun/policy/availability.py) to recorded spot capacity.

    python benchmarks/fit_availability.py --spot-traces DIR [--set choose]
    python benchmarks/fit_availability.py --spot-traces DIR --set all --model droughts-level

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

The cycles' regimes of waits: a two-state hidden Markov model over the cycles' waits (Baum-Welch, Rabiner 1989),
each state drawing log(down) from its own normal, the state kept from one cycle to the next with its own
probability; the most likely state sequence of each trace (Viterbi) labels every cycle. (`regimes` can also fit
on log(up) and log(down) together, as the model did before; regimes fitted so paired short stretches with long
waits, which the recordings do not: docs/spot-policy.md, "Calibration".) It prints, as Python to paste into
spotrun/policy/availability.py:
- `SHORT`: the share of the cycles whose stretch with capacity is short, `UP_SHORT`: those stretches' quantiles
  in seconds, `UP`: the quantiles of the other stretches with capacity (over their trace's mean long one), all
  traces and regimes together;
- per regime (the one with the longer waits first), `down`: the quantiles of its waits, and `stay`: how often a
  cycle of that regime is followed by one of the same (the labels' counts);
- the waits' own persisting level (Chain's `wait_share`, `wait_lag1`: `wait_persistence`, the same least squares
  on the waits' normal scores, the regimes keeping their shares of the cycles), with the stay probabilities it
  implies and the recorded, regime-chain and level correlations: measured, not pasted (docs/spot-policy.md);
- `UP_LEVEL_SHARE`, `UP_LEVEL_LAG1`: the persisting level of the stretches with capacity (`level_persistence`):
  the share and lag-1 correlation whose generated stretches, at each trace's rate and length, have the recorded
  correlations of normal scores (within each trace) at 1-8 cycles apart, by least squares (both curves printed);
- `DOWN_MEAN_AT_ONE_PER_HOUR_S`, `DOWN_RATE_EXPONENT`: c and beta of a trace's mean stretch without capacity
  = c x rate^beta (least squares on the logarithms over the traces): where capacity is interrupted more often it
  also takes longer to come back;
- `SHORT_FITTED_UP_TO_PER_HOUR`: the fastest trace's rate (the short stretches keep their seconds up to it);
  `SHORT_SHARE_AT_ONE_PER_HOUR`, `SHORT_SHARE_RATE_EXPONENT`: c and beta of a trace's share of short stretches
  = c x rate^beta (the same least squares): the share is scaled to it at the run's rate.

The procedure is also a function (`fit_chain`: `CHAIN` fitted on given recordings, on the choose set `CHAIN` itself;
`fit_model`: it or a measured alternative), which benchmarks/calibration_bench.py `--set loo` fits on every 16 of
the 17 recordings.

`--model droughts-level` prints instead the estimate's model, `ESTIMATE_CHAIN` (`fit_model`'s droughts-level: the
procedure above, the droughts' table and share as `--droughts` fits them, and the spread of the traces' levels of
waits around the power law), every field of it as the Python pasted into spotrun/policy/availability.py
(`chain_source`); `--set all` fits it on all 17 recordings, as the estimate ships it (docs/spot-policy.md, "Leave
one recording out": out of sample the best calibrated model measured).

`--droughts` prints the droughts' tables instead, and `--spells` the recorded cycles themselves as the module
spotrun/policy/spells.py (`Bootstrap`'s table: every stretch with capacity that was interrupted and the wait after it,
in recorded seconds, with each recording's rate); both measured, not in CHAIN (docs/spot-policy.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
import textwrap
from pathlib import Path
from statistics import NormalDist

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.policy_bench import windows  # noqa: E402
from spotrun.policy.availability import (  # noqa: E402
    CHAIN,
    DROUGHT_S,
    LAWS,
    LEVELS,
    SHORT_UP_S,
    Bootstrap,
    Chain,
    RateLaws,
    Regime,
    fitted_trace,
)
from spotrun.policy.traces import read_availability  # noqa: E402

TAIL_DEADLINES_H = (40.0, 48.0, 60.0, 80.0)  # the first D hours whose hours without capacity the spread matches
TAIL_LEVELS = (0.9, 0.95, 0.99)  # at these quantiles over the windows
TAIL_EVERY_H = 6.0  # a window every this many hours of a recording (benchmarks/calibration_bench.py's)
LAGS = tuple(range(1, 9))  # the lags whose correlations of stretches with capacity the persistent level matches


def stretches(rec) -> tuple[float, float, list[float], list[float]]:
    """(interruptions per available hour, mean down in seconds, ups times the rate, downs over their mean): every
    cycle of the recording (a stretch with capacity and the one without after it), not wrapped."""
    ups = [b - a for a, b in rec.windows]
    rate = len(rec.windows) / sum(ups)
    downs = [a2 - b for (_, b), (a2, _) in zip(rec.windows, rec.windows[1:], strict=False)]
    mean_down = sum(downs) / len(downs)
    return rate * 3600, mean_down, [u * rate for u in ups[:len(downs)]], [d / mean_down for d in downs]


def spells(rec) -> tuple[float, list[float]]:
    """(interruptions per available hour, every cycle of the recording as a flat list up_s, wait_s, ...): the
    stretches with capacity that were interrupted and the wait after each, in recorded seconds; a window open at the
    recording's end left out (`Bootstrap`'s spells)."""
    w = rec.windows
    rate = len(w) / sum(b - a for a, b in w) * 3600
    return rate, [x for (a, b), (a2, _) in zip(w, w[1:], strict=False) for x in (b - a, a2 - b)]


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


def unavailable_h(trace: list, end_s: float) -> float:
    """Hours without capacity in a trace's first `end_s` seconds."""
    return (end_s - sum(min(b, end_s) - a for a, b in trace if a < end_s)) / 3600


def weighted_quantile(pairs: list[tuple[float, float]], q: float) -> float:
    """The q quantile of (value, weight) pairs: the least value whose cumulative weight reaches q of the total."""
    pairs = sorted(pairs)
    total, acc = sum(w for _, w in pairs), 0.0
    for v, w in pairs:
        acc += w
        if acc >= q * total - 1e-9:
            return v
    return pairs[-1][0]


def window_tail(samples: dict[float, list[tuple[float, float]]]) -> list[float]:
    """The `TAIL_LEVELS` quantiles of hours without capacity (value, weight) at each D of `samples`, in order."""
    return [weighted_quantile(samples[d], q) for d in sorted(samples) for q in TAIL_LEVELS]


def generated_tail(chain: Chain, rates: list[float], counts: dict[float, list[int]], n: int, seed: int = 0
                   ) -> list[float]:
    """`window_tail` of `n` traces of `chain` per rate, each trace's first D hours weighted by its rate's windows
    at D (`counts`) over n."""
    rng = random.Random(seed)
    far = max(counts) * 3600
    samples: dict[float, list[tuple[float, float]]] = {d: [] for d in counts}
    for k, rate in enumerate(rates):
        for _ in range(n):
            trace = fitted_trace(rate, far, rng, chain)
            for d in counts:
                if counts[d][k]:
                    samples[d].append((unavailable_h(trace, d * 3600), counts[d][k] / n))
    return window_tail(samples)


def level_spread(rates: list[float], means: list[float]) -> float:
    """The standard deviation (n - 1) of log(a trace's mean wait / the power law's at its rate) (`power_law` fitted
    on the same traces): how far traces at one rate spread around it (Chain's `wait_level_sd`)."""
    c, beta = power_law(rates, means)
    return statistics.stdev(math.log(m / (c * r ** beta)) for r, m in zip(rates, means, strict=True))


def droughts(rates: list[float], waits: list[list[float]], drought_s: float = DROUGHT_S
             ) -> tuple[float, float, list[float]]:
    """(c, beta, table) of the droughts (waits over `drought_s` seconds) of traces at `rates` (interruptions per
    available hour; `waits` each trace's waits in seconds): the share of a trace's waits that are droughts = c x
    rate^beta, by maximum likelihood with each trace's count of droughts binomial in its waits (a trace without any
    counts, where least squares on logarithms could not take it), and the droughts' quantiles in seconds, pooled."""
    counts = [sum(w > drought_s for w in ws) for ws in waits]
    sizes = [len(ws) for ws in waits]
    if not sum(counts):
        raise ValueError(f"no wait over {drought_s:g} s in these traces: no droughts to fit")

    def fit(beta: float) -> tuple[float, float]:
        c = sum(counts) / sum(n * r ** beta for n, r in zip(sizes, rates, strict=True))
        ll = 0.0
        for k, n, r in zip(counts, sizes, rates, strict=True):
            p = min(c * r ** beta, 1 - 1e-12)
            ll += (k * math.log(p) if k else 0.0) + (n - k) * math.log(1 - p)
        return ll, c

    best = max((fit(b / 1000), b / 1000) for b in range(-3000, 3001))
    (_, c), beta = best
    return c, beta, quantiles([w for ws in waits for w in ws if w > drought_s], LEVELS)


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
            raw_ups: list[list[float]] | None = None, columns: tuple[int, ...] = (0, 1)) -> list[dict]:
    """Per regime, the longer mean log-down first: its cycles' up and down quantiles and its stay probability,
    from the Viterbi labels of the fitted HMM (seqs: per trace, rows of (up, down) in mean-1 units; the HMM sees
    the `columns` of them: (1,) for the waits alone). With
    `short` (per trace, per cycle: a short stretch with capacity) and `raw_ups` (per trace, per cycle: the short
    ones in seconds, the others over their trace's mean long one), also the regime's share of short stretches,
    their quantiles in seconds (`up_short`), and `up` the quantiles of the others (mean-1 units of long ones)."""
    logs = [np.log(s)[:, list(columns)] for s in seqs]
    _, trans, mu, sd, _ = fit_hmm(logs)
    order = np.argsort(-mu[:, columns.index(1)])
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


def normal_scores(xs) -> np.ndarray:
    """Each value's normal score within its sequence: the standard normal quantile of its mid-rank (ties share
    their mean rank)."""
    xs = np.asarray(xs, dtype=float)
    ranks = np.empty(len(xs))
    ranks[xs.argsort(kind="stable")] = np.arange(len(xs))
    for v in np.unique(xs):
        ranks[xs == v] = ranks[xs == v].mean()
    return np.array([NormalDist().inv_cdf((r + 0.5) / len(xs)) for r in ranks])


def lag_correlations(seqs: list, lags: tuple[int, ...] = LAGS) -> np.ndarray:
    """The correlation of normal scores `lag` cycles apart, pooled over the sequences (each scored on its own)."""
    scores = [normal_scores(x) for x in seqs]
    return np.array([np.corrcoef(np.concatenate([z[:-lag] for z in scores]),
                                 np.concatenate([z[lag:] for z in scores]))[0, 1] for lag in lags])


def generated_ups(chain: Chain, rates: list[float], lengths: list[int], repeats: int, seed: int = 0,
                  column: int = 1) -> list:
    """`repeats` sequences of generated stretches with capacity (`column` 2: the waits) per trace, at its rate
    and of its length in cycles (the first cycle, a remainder, left out)."""
    rng = random.Random(seed)
    out = []
    for rate, n in zip(rates, lengths, strict=True):
        for _ in range(repeats):
            gen = chain.cycles(rate, rng)
            next(gen)
            out.append([next(gen)[column] for _ in range(n)])
    return out


def _persistence(seqs: list[list[float]], rates: list[float], chain, column: int, repeats: int, seed: int,
                 grid_lag1: tuple[float, ...]) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(share, lag1, recorded, generated): the latent level (share, lag-1) for which `chain(share, lag1)`'s
    generated `column`, at each trace's rate and length, has the recorded correlations of normal scores at lags
    1-8 (least squares; a grid, then a finer one around its best; the same draws for every candidate)."""
    target = lag_correlations(seqs)
    lengths = [len(u) for u in seqs]

    def error(share: float, lag1: float) -> tuple[float, np.ndarray]:
        got = lag_correlations(generated_ups(chain(share, lag1), rates, lengths, repeats, seed, column))
        return float(((got - target) ** 2).sum()), got

    grid = [(w, phi) for w in np.arange(0.0, 0.51, 0.05) for phi in grid_lag1]
    best = min(grid, key=lambda c: error(*c)[0])
    fine = [(w, phi) for w in np.arange(best[0] - 0.04, best[0] + 0.041, 0.01) if 0 <= w < 1
            for phi in np.arange(best[1] - 0.04, best[1] + 0.041, 0.01) if 0 <= phi < 1]
    share, lag1 = min(fine, key=lambda c: error(*c)[0])
    return float(share), float(lag1), target, error(share, lag1)[1]


def level_persistence(ups: list[list[float]], rates: list[float], regimes_: tuple, repeats: int = 10,
                      seed: int = 0, laws: RateLaws = LAWS) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(share, lag1, recorded, generated): the persistent level of the stretches with capacity (Chain's
    `level_share`, `level_lag1`) whose generated traces, at each trace's rate and length (the rate's power laws
    `laws`), have the recorded correlations of normal scores at lags 1-8 (`_persistence`), with both curves."""
    return _persistence(ups, rates, lambda w, phi: Chain(regimes_, w, phi, laws=laws), 1, repeats, seed,
                        (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95))


def wait_persistence(downs: list[list[float]], rates: list[float], regimes_: tuple, repeats: int = 10,
                     seed: int = 0, level: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float, np.ndarray,
                                                                                       np.ndarray]:
    """(share, lag1, recorded, generated): the waits' persistent level (Chain's `wait_share`, `wait_lag1`; the
    regimes keep their shares of the cycles, `regimes_`' occupancy) whose generated waits, at each trace's rate
    and length, have the recorded correlations of normal scores at lags 1-8 (`_persistence`); `level`: the
    stretches' (share, lag1), which the waits do not depend on."""
    return _persistence(downs, rates, lambda w, phi: Chain(regimes_, *level, w, phi), 2, repeats, seed,
                        (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97))


def _table(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in values) + ")"


def spells_module(paths: list[Path], set_name: str) -> str:
    """The text of spotrun/policy/spells.py: every cycle of the recordings at `paths` (`spells`), one tuple each."""
    traces = [(f"{p.parent.name}/{p.stem}", *spells(read_availability(p))) for p in paths]
    cycles = sum(len(flat) // 2 for _, _, flat in traces)
    where = {"choose": "even positions", "held-out": "odd positions"}.get(set_name, "every trace")
    head = textwrap.fill(
        "The recorded cycles of the availability traces the bootstrap model resamples (spotrun/policy/availability.py "
        f"`Bootstrap`): per recording of github.com/skypilot-org/spot-traces (availability/1-node, the {set_name} "
        f"set: {where} in sorted path order), its interruptions per available hour and every stretch with capacity "
        f"that was interrupted followed by the wait after it, in recorded seconds ({len(traces)} recordings, {cycles} "
        "cycles). Generated by", 117)
    lines = ['"""' + head, "",
             f"    python benchmarks/fit_availability.py --spot-traces DIR --set {set_name} --spells "
             "> spotrun/policy/spells.py",
             '"""', "", "SPELLS = ("]
    for name, rate, flat in traces:
        lines.append(f"    ({rate:.6g}, (  # {name}: {len(flat) // 2} cycles")
        row = "       "
        for x in flat:
            cell = f" {x:.0f},"
            if len(row) + len(cell) > 118:
                lines.append(row)
                row = "       "
            row += cell
        lines += [row, "    )),"]
    return "\n".join(lines + [")", ""])


@dataclasses.dataclass(frozen=True)
class Cycles:
    """What the fit reads of each recording: its rate (interruptions per available hour), its mean wait (s), its
    cycles as rows (up x rate, wait / its mean), per cycle whether the stretch with capacity is short, the
    stretches with capacity as `blips` splits them (short in seconds, others over their mean long one), and its
    share of short stretches."""

    rates: list[float]
    means: list[float]
    seqs: list[np.ndarray]
    short: list[list[bool]]
    raw_ups: list[list[float]]
    shares: list[float]


def read_cycles(recs: list) -> Cycles:
    """`Cycles` of the recordings `recs` (`read_availability`'s), in order."""
    cyc = Cycles([], [], [], [], [], [])
    for rec in recs:
        rate, mean_down, u, d = stretches(rec)
        cyc.rates.append(rate)
        cyc.means.append(mean_down)
        cyc.seqs.append(np.array([u, d]).T)
        flags, blip_s, longs = blips(rec)
        blip_it, long_it = iter(blip_s), iter(longs)
        cyc.short.append(flags)
        cyc.shares.append(sum(flags) / len(flags))
        cyc.raw_ups.append([next(blip_it) if f else next(long_it) for f in flags])
    return cyc


def _rounded(values: list[float]) -> tuple[float, ...]:
    """A table as the fit prints it (4 significant figures): what is pasted into availability.py."""
    return tuple(float(f"{v:.4g}") for v in values)


def fit_chain(cyc: Cycles) -> tuple[Chain, dict]:
    """`CHAIN`'s procedure (the base of the estimate's `ESTIMATE_CHAIN`) fitted on `cyc` (every parameter of it, at the
    precision the fit prints and availability.py pastes: the pooled stretches, the regimes of waits, the stretches'
    persisting level, the rate's power laws), and the figures printed beside it: `pooled` (short, up_short, up),
    `regimes` (`regimes`' dicts), `level` (share, lag1, recorded and generated correlations)."""
    flags = [f for fl in cyc.short for f in fl]
    pairs = [(f, u) for fl, ups in zip(cyc.short, cyc.raw_ups, strict=True) for f, u in zip(fl, ups, strict=True)]
    pooled = {"short": sum(flags) / len(flags), "up_short": quantiles([u for f, u in pairs if f], LEVELS),
              "up": quantiles([u for f, u in pairs if not f], LEVELS)}
    fitted = regimes(cyc.seqs, columns=(1,))
    chain_regimes = tuple(Regime(stay=round(float(r["stay"]), 4), down=_rounded(r["down"]),
                                 short=round(pooled["short"], 4), up_short=_rounded(pooled["up_short"]),
                                 up=_rounded(pooled["up"])) for r in fitted)
    c, beta = power_law(cyc.rates, cyc.means)
    share_c, share_beta = power_law(cyc.rates, cyc.shares)
    laws = RateLaws(round(c), round(beta, 3), float(f"{max(cyc.rates):.3g}"), round(share_c, 3), round(share_beta, 3))
    level = level_persistence([list(seq[:, 0]) for seq in cyc.seqs], cyc.rates, chain_regimes, laws=laws)
    chain = Chain(chain_regimes, round(level[0], 2), round(level[1], 2), laws=laws)
    return chain, {"pooled": pooled, "regimes": fitted, "level": level}


def fit_model(name: str, recs: list, chain: Chain | None = None) -> Chain | Bootstrap:
    """Availability model `name` (benchmarks/calibration_bench.py's `--model`) fitted on the recordings `recs` by
    this command's procedure: `regimes` (`fit_chain`: CHAIN's), `droughts` (and the droughts' table and
    share, `--droughts`), `droughts-level` (and each trace's level of waits), `bootstrap` (their recorded cycles,
    `--spells`, the waits rescaled by the power law fitted on them) or `bootstrap-recorded-waits`. `chain`: the
    `regimes` model already fitted on `recs` (the others build on it)."""
    cyc = read_cycles(recs)
    if chain is None:
        chain, _ = fit_chain(cyc)
    if name.startswith("bootstrap"):
        return Bootstrap(tuple((rate, tuple(flat)) for rate, flat in map(spells, recs)), laws=chain.laws,
                         waits="recorded" if name == "bootstrap-recorded-waits" else "power")
    if name.startswith("droughts"):
        waits = [[a2 - b for (_, b), (a2, _) in zip(r.windows, r.windows[1:], strict=False)] for r in recs]
        dc, dbeta, table = droughts(cyc.rates, waits)
        chain = dataclasses.replace(chain, droughts=_rounded(table), drought_share_at_one_per_hour=round(dc, 4),
                                    drought_rate_exponent=round(dbeta, 3))
        if name == "droughts-level":
            chain = dataclasses.replace(chain, wait_level_sd=round(level_spread(cyc.rates, cyc.means), 2))
        return chain
    if name != "regimes":
        raise ValueError(f"model {name!r} is unknown: expected regimes, droughts, droughts-level, bootstrap or "
                         "bootstrap-recorded-waits")
    return chain


def _wrapped(head: str, values: tuple[float, ...], tail: str, indent: int) -> list[str]:
    """`head` + the table (4 significant figures) + `tail`, wrapped at 120 characters under `indent` spaces."""
    return textwrap.wrap(head + _table(list(values))[1:-1] + tail, 120, initial_indent=" " * indent,
                         subsequent_indent=" " * (indent + len(head)), break_on_hyphens=False)


def chain_source(chain: Chain, name: str) -> str:
    """`chain` as the Python that spotrun/policy/availability.py pastes: the stretches' tables (shared by both
    regimes, as `fit_chain` fits them) named once, `{name}_UP_SHORT` and `{name}_UP`, then `{name} = Chain(...)`
    with every field; every number as the fit rounded it, so the text is the chain exactly."""
    first = chain.regimes[0]
    if any((r.up, r.up_short, r.short) != (first.up, first.up_short, first.short) for r in chain.regimes):
        raise ValueError("the regimes' stretches with capacity differ: expected one pooled table, as fit_chain fits")
    if chain.wait_share is not None or chain.droughts is None:
        raise ValueError("expected a chain with droughts and without a wait level, as fit_model fits droughts-level")
    lines = [f"{name}_UP_SHORT = (", *_wrapped("", first.up_short, ")", 4), f"{name}_UP = (",
             *_wrapped("", first.up, ")", 4), f"{name} = Chain(", "    regimes=("]
    for r in chain.regimes:
        lines += [f"        Regime(stay={r.stay!r}, short={r.short!r}, up_short={name}_UP_SHORT, up={name}_UP,",
                  *_wrapped("down=(", r.down, ")),", 15)]
    laws = chain.laws
    lines += ["    ),",
              f"    level_share={chain.level_share!r}, level_lag1={chain.level_lag1!r},",
              *_wrapped("droughts=(", chain.droughts, "),", 4),
              f"    drought_share_at_one_per_hour={chain.drought_share_at_one_per_hour!r}, "
              f"drought_rate_exponent={chain.drought_rate_exponent!r},",
              f"    wait_level_sd={chain.wait_level_sd!r},",
              f"    laws=RateLaws(down_mean_at_one_per_hour_s={laws.down_mean_at_one_per_hour_s!r}, "
              f"down_rate_exponent={laws.down_rate_exponent!r},",
              f"                  short_fitted_up_to_per_hour={laws.short_fitted_up_to_per_hour!r}, "
              f"short_share_at_one_per_hour={laws.short_share_at_one_per_hour!r},",
              f"                  short_share_rate_exponent={laws.short_share_rate_exponent!r}),",
              ")"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spot-traces", type=Path, required=True, help="where skypilot-org/spot-traces is")
    parser.add_argument("--set", choices=["choose", "held-out", "all"], default="choose",
                        help="which traces: even positions (choose), odd (held-out) or all")
    parser.add_argument("--droughts", action="store_true",
                        help="only the droughts (waits over DROUGHT_S): their share of the waits as a power law of "
                        "the rate and their quantiles in seconds (Chain's droughts: measured, not in CHAIN)")
    parser.add_argument("--spells", action="store_true",
                        help="only the recorded cycles themselves, as the module spotrun/policy/spells.py (Bootstrap's "
                        "table: measured, not in CHAIN)")
    parser.add_argument("--model", choices=["regimes", "droughts-level"], default="regimes",
                        help="regimes (the default): CHAIN's constants and the figures beside them; droughts-level: "
                        "the estimate's model (ESTIMATE_CHAIN: CHAIN's procedure, the droughts and each trace's level "
                        "of waits, fit_model's) as the Python pasted into spotrun/policy/availability.py")
    args = parser.parse_args()
    if args.model != "regimes" and (args.droughts or args.spells):
        parser.error(f"--model {args.model} prints the whole model: give it without --droughts and --spells")
    paths = sorted(args.spot_traces.glob("availability/1-node/*/*.json"))
    if not paths:
        raise SystemExit(f"--spot-traces {args.spot_traces}: no availability/1-node/*/*.json under it")
    keep = {"choose": 0, "held-out": 1}.get(args.set)
    paths = [p for i, p in enumerate(paths) if keep is None or i % 2 == keep]
    if args.spells:
        print(spells_module(paths, args.set), end="")
        return
    recs = [read_availability(p) for p in paths]
    if args.model == "droughts-level":
        print(f"# {len(paths)} traces ({args.set}): CHAIN's procedure, the droughts and each trace's level of waits")
        print(chain_source(fit_model(args.model, recs), "ESTIMATE_CHAIN"), end="")
        return
    cyc = read_cycles(recs)
    rates, means = cyc.rates, cyc.means
    if args.droughts:
        waits = [[a2 - b for (_, b), (a2, _) in zip(r.windows, r.windows[1:], strict=False)] for r in recs]
        dc, dbeta, table = droughts(rates, waits)
        print(f"# {len(paths)} traces ({args.set}): {sum(map(len, waits))} waits, "
              f"{sum(w > DROUGHT_S for ws in waits for w in ws)} over {DROUGHT_S:g} s")
        print(f"DROUGHT_SHARE_AT_ONE_PER_HOUR = {dc:.4f}")
        print(f"DROUGHT_SHARE_RATE_EXPONENT = {dbeta:.3f}")
        print(f"DROUGHTS = {_table(table)}")
        chain = dataclasses.replace(CHAIN, droughts=tuple(table), drought_share_at_one_per_hour=round(dc, 4),
                                    drought_rate_exponent=round(dbeta, 3))
        samples, counts = {}, {}
        for d in TAIL_DEADLINES_H:
            todo = windows(recs, d, TAIL_EVERY_H)
            samples[d] = [(unavailable_h(t, d * 3600), 1.0) for _, t in todo]
            counts[d] = [sum(1 for k, _ in todo if k == i) for i in range(len(recs))]
        target = window_tail(samples)
        sd = level_spread(rates, means)
        print(f"WAIT_LEVEL_SD = {sd:.2f}")
        leveled = dataclasses.replace(chain, wait_level_sd=round(sd, 2))
        print(f"# hours without capacity in the first {'/'.join(f'{d:g}' for d in TAIL_DEADLINES_H)} h of a window "
              f"every {TAIL_EVERY_H:g} h, P{'/P'.join(f'{100 * q:g}' for q in TAIL_LEVELS)}: recorded "
              f"{' '.join(f'{x:.1f}' for x in target)}; the droughts "
              f"{' '.join(f'{x:.1f}' for x in generated_tail(chain, rates, counts, 200))}; and the level "
              f"{' '.join(f'{x:.1f}' for x in generated_tail(leveled, rates, counts, 200))}; neither "
              f"{' '.join(f'{x:.1f}' for x in generated_tail(CHAIN, rates, counts, 200))}")
        return
    chain, fig = fit_chain(cyc)
    pooled, fitted, laws = fig["pooled"], fig["regimes"], chain.laws
    chain_regimes = chain.regimes
    print(f"# {len(paths)} traces ({args.set}): {sum(map(len, cyc.seqs))} cycles; short stretches with capacity: "
          f"at most {SHORT_UP_S:g} s")
    print(f"SHORT = {pooled['short']:.4f}")
    print(f"UP_SHORT = {_table(pooled['up_short'])}")
    print(f"UP = {_table(pooled['up'])}")
    share, lag1, target, got = fig["level"]
    print(f"UP_LEVEL_SHARE = {share:.2f}")
    print(f"UP_LEVEL_LAG1 = {lag1:.2f}")
    print("# correlations of normal scores of the stretches with capacity at lags "
          f"{LAGS[0]}-{LAGS[-1]}: recorded {' '.join(f'{x:.3f}' for x in target)}; "
          f"generated {' '.join(f'{x:.3f}' for x in got)}")
    before = lag_correlations(generated_ups(chain, rates, [len(q) for q in cyc.seqs], 10, 0, column=2))
    wait_share, wait_lag1, target, got = wait_persistence([list(seq[:, 1]) for seq in cyc.seqs], rates,
                                                          chain_regimes, level=(share, lag1))
    stays = Chain(chain_regimes, share, lag1, round(wait_share, 2), round(wait_lag1, 2)).implied_stays
    print("REGIMES = (")
    for r in fitted:
        print(f"    Regime(stay={r['stay']:.4f}, short=SHORT, up_short=UP_SHORT, up=UP,  # {r['cycles']} cycles\n"
              f"           down={_table(r['down'])}),")
    print(")")
    print("# correlations of normal scores of the waits at lags "
          f"{LAGS[0]}-{LAGS[-1]}: recorded {' '.join(f'{x:.3f}' for x in target)}; the regimes' Markov chain "
          f"(REGIMES) {' '.join(f'{x:.3f}' for x in before)}")
    print(f"# the waits' own level instead (Chain's wait_share, wait_lag1; not in CHAIN: no better calibrated, "
          f"docs/spot-policy.md): {wait_share:.2f}, {wait_lag1:.2f}, generated {' '.join(f'{x:.3f}' for x in got)}; "
          f"the regimes' stay at it {stays[0]:.4f}, {stays[1]:.4f} (their shares of the cycles kept)")
    print(f"DOWN_MEAN_AT_ONE_PER_HOUR_S = {laws.down_mean_at_one_per_hour_s:.0f}")
    print(f"DOWN_RATE_EXPONENT = {laws.down_rate_exponent:.3f}")
    print(f"SHORT_FITTED_UP_TO_PER_HOUR = {laws.short_fitted_up_to_per_hour:.3g}")
    print(f"SHORT_SHARE_AT_ONE_PER_HOUR = {laws.short_share_at_one_per_hour:.3f}")
    print(f"SHORT_SHARE_RATE_EXPONENT = {laws.short_share_rate_exponent:.3f}")

if __name__ == "__main__":
    main()
