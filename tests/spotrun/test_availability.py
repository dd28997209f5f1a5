"""The estimate's availability model (spotrun/policy/availability.py) and the command that fits it
(benchmarks/fit_availability.py): the rate it is given is the rate its traces have, a job is created at a random
moment of the process (not at a return of capacity), the sampler reproduces the regimes' occupancy, persistence
and stretch quantiles it was fitted to, a fit on traces drawn from known regimes recovers them, the levels that
carry the stretches' (and, as an option, the waits') persistence reproduce it and a fit on draws with a known level
recovers it, and the fit's quantiles and power law are the textbook ones."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import numpy as np
import pytest

from benchmarks.fit_availability import (
    blips,
    droughts,
    fit_hmm,
    level_spread,
    power_law,
    quantiles,
    regimes,
    spells,
    stretches,
)
from spotrun.policy.availability import (
    BOOTSTRAP,
    BOOTSTRAP_RECORDED_WAITS,
    CHAIN,
    CHAIN_DROUGHTS,
    DOWN_RATE_EXPONENT,
    DROUGHT_S,
    DROUGHT_SHARE_AT_ONE_PER_HOUR,
    DROUGHT_SHARE_RATE_EXPONENT,
    DROUGHTS,
    ESTIMATE_CHAIN,
    LAWS,
    LEVELS,
    REGIMES,
    SHORT_FITTED_UP_TO_PER_HOUR,
    SHORT_UP_S,
    UP,
    WAIT_LEVEL_SD,
    Bootstrap,
    Chain,
    RateLaws,
    Regime,
    Stretches,
    fitted_trace,
    mean_down_s,
    short_share_at,
)
from spotrun.policy.traces import INF, Recording, TraceSpec, generated_traces

H = 3600.0


def _available_at(trace: list, t: float) -> bool:
    return any(a <= t < b for a, b in trace)


@pytest.mark.parametrize("rate", [0.1, 1.4])
def test_fitted_traces_are_interrupted_at_the_rate_asked_for_per_hour_with_capacity(rate):
    """The interruption recorder's rate is interruptions per hour a job runs: the same count over the same hours
    of generated capacity up to the horizon (the open last window counted to it), whatever the fitted shapes."""
    horizon = 2000 * (1 / rate + mean_down_s(rate) / H) * H  # about 2,000 cycles per trace
    traces = generated_traces(TraceSpec(rate, horizon_s=horizon, fitted=True), 40, seed=3)
    ends = sum(len(t) - 1 for t in traces)
    up_hours = sum(min(b, horizon) - a for t in traces for a, b in t if a < horizon) / H
    assert ends / up_hours == pytest.approx(rate, rel=0.05)


def test_a_job_is_created_at_a_random_moment_not_when_capacity_returns():
    """Stationary start: the share of traces with capacity at creation equals the share a while later, and both
    equal the long-run share mean_up / (mean_up + mean_down) measured on the draws themselves (a start at the
    beginning of a window would give 100% at creation)."""
    rng = random.Random(11)
    traces = [fitted_trace(0.6, 200 * H, rng) for _ in range(2000)]
    ups = [b - a for t in traces for a, b in t[1:-1]]
    downs = [a2 - b for t in traces for (_, b), (a2, _) in zip(t[1:-1], t[2:-1], strict=False)]
    long_run = statistics.fmean(ups) / (statistics.fmean(ups) + statistics.fmean(downs))
    at_zero = sum(_available_at(t, 0.0) for t in traces) / len(traces)
    later = sum(_available_at(t, 100 * H) for t in traces) / len(traces)
    assert at_zero == pytest.approx(later, abs=0.04)
    assert at_zero == pytest.approx(long_run, abs=0.04)
    assert 0.2 < at_zero < 0.95  # neither always on nor always off at this rate


def test_waits_for_capacity_grow_with_the_rate_and_keep_the_fitted_mean():
    rng = random.Random(5)
    for rate in (0.1, 1.0, 5.0):
        downs = [a2 - b for _ in range(300) for (_, b), (a2, _) in
                 zip(*(lambda t: (t[:-1], t[1:]))(fitted_trace(rate, 400 * H, rng)), strict=False)]
        assert statistics.fmean(downs) == pytest.approx(mean_down_s(rate), rel=0.1)
    assert mean_down_s(0.1) < mean_down_s(1.0) < mean_down_s(5.0)
    # the shapes are sample means of 1 over the cycles (the stretches with capacity that are not short: over their
    # trace's mean long one); the tables (linear between quantiles) keep that within 10%, and a trace is scaled by
    # the chain's own long-run means
    weights = [p * (1 - r.short) for p, r in zip(CHAIN.occupancy, CHAIN.regimes, strict=True)]
    mean_long = sum(w * r.ups.mean for w, r in zip(weights, CHAIN.regimes, strict=True)) / sum(weights)
    assert mean_long == pytest.approx(1.0, rel=0.1) and CHAIN.mean_down == pytest.approx(1.0, rel=0.1)
    assert fitted_trace(0.0, 100 * H, rng) == [(0.0, INF)]


def test_a_chain_scales_by_its_own_rate_laws():
    """A chain fitted on other recordings carries its own power laws (`RateLaws`): its waits are one factor of
    CHAIN's, the ratio of the two laws' mean waits at the rate, and its short stretches' share and the rate
    up to which they keep their seconds are its own; a law that is not a number > 0 is refused by name."""
    rate = 0.5
    laws = RateLaws(down_mean_at_one_per_hour_s=3 * H, down_rate_exponent=0.6, short_fitted_up_to_per_hour=0.4,
                    short_share_at_one_per_hour=0.2, short_share_rate_exponent=0.1)
    own = dataclasses.replace(CHAIN, laws=laws)
    assert laws.mean_down_s(rate) == pytest.approx(3 * H * rate ** 0.6)
    assert laws.mean_down_s(rate) != pytest.approx(LAWS.mean_down_s(rate), rel=0.2)  # the check tells them apart
    waits_only = dataclasses.replace(CHAIN, laws=dataclasses.replace(LAWS, down_mean_at_one_per_hour_s=3 * H,
                                                                     down_rate_exponent=0.6))
    plain, scaled = CHAIN.cycles(rate, random.Random(4)), waits_only.cycles(rate, random.Random(4))
    pairs = [(next(plain), next(scaled)) for _ in range(2001)][1:]
    assert all(a[:2] == b[:2] for a, b in pairs)  # regimes and stretches with capacity: the same
    assert {round(b[2] / a[2], 9) for a, b in pairs} == {round(laws.mean_down_s(rate) / LAWS.mean_down_s(rate), 9)}
    ratio = laws.short_share_at(rate) / LAWS.short_share_at(rate)
    assert own.shares(rate)[0] / CHAIN.shares(rate)[0] == pytest.approx(ratio)
    assert laws.short_share_at(5.0) == pytest.approx(0.2 * 0.4 ** 0.1)  # the share at the fastest rate fitted
    assert own.scales(rate)[1] == pytest.approx(0.4 / rate)  # short stretches shrink past 0.4 per hour, not 1.39
    # CHAIN scales by the choose set's laws; the estimate's mean wait is its own model's
    assert CHAIN.laws == LAWS and ESTIMATE_CHAIN.laws.mean_down_s(rate) == mean_down_s(rate)
    with pytest.raises(ValueError, match="down_mean_at_one_per_hour_s=0 is invalid: expected a number > 0"):
        RateLaws(down_mean_at_one_per_hour_s=0)


def test_a_recorded_mean_wait_scales_the_waits_and_keeps_their_shape_regimes_and_the_rate():
    """Given a mean wait (recorded, or the run's checkpoint.mean_wait_hours), the waits have that long-run mean
    instead of the power law's at the rate; each regime's table keeps its shape (the same draws, times one
    factor), the stretches with capacity and the rate are untouched; without one, the traces are the same."""
    rate, wait = 0.3, 5.1 * H
    assert LAWS.mean_down_s(rate) < 0.5 * wait  # far from the power law's, so the check tells them apart
    plain, scaled = CHAIN.cycles(rate, random.Random(9)), CHAIN.cycles(rate, random.Random(9), wait)
    pairs = [(next(plain), next(scaled)) for _ in range(20_001)][1:]  # the first cycle is a remainder
    assert all(a[0] == b[0] and a[1] == b[1] for a, b in pairs)  # regimes and stretches with capacity: the same
    ratios = {round(b[2] / a[2], 9) for a, b in pairs}
    assert ratios == {round(wait / LAWS.mean_down_s(rate), 9)}  # one factor: the tables' shapes are kept
    assert statistics.fmean(b[2] for _, b in pairs) == pytest.approx(wait, rel=0.1)
    rng = random.Random(1)
    spec = TraceSpec(rate, horizon_s=300 * H, fitted=True, mean_wait_s=wait)
    assert generated_traces(spec, 3, seed=1) == [fitted_trace(rate, 300 * H, rng, mean_wait_s=wait) for _ in range(3)]
    assert generated_traces(TraceSpec(rate, horizon_s=300 * H, fitted=True), 3, seed=1) != \
        generated_traces(spec, 3, seed=1)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="mean_wait_s="):
            TraceSpec(rate, horizon_s=H, fitted=True, mean_wait_s=bad)
        with pytest.raises(ValueError, match="mean_wait_s="):
            CHAIN.scales(rate, bad)


def _cdf_checks(table: tuple[float, ...]) -> list[tuple[float, float]]:
    """(level, value) at levels from the first to the last decile where the table rises on both sides (a flat
    step is an atom: the share at or below it is not its level)."""
    out = []
    for i, q in enumerate(LEVELS):
        if 0.1 <= q <= 0.9 and round(q * 50) % 5 == 0 and table[i - 1] < table[i] < table[i + 1]:
            out.append((q, table[i]))
    return out


def test_the_sampler_reproduces_each_regimes_occupancy_persistence_and_stretch_quantiles():
    """On 20,000 generated cycles: the share in each regime is the chain's stationary share, a regime is kept
    with its fitted `stay` probability, its share of short stretches with capacity is its share at the rate, and
    each regime's other stretches and waits fall below its tables' quantiles as often as the levels say (within ~4
    standard errors; regimes persist, so occupancy's error is ~3x a binomial one). At 0.1 per hour the other
    stretches are all longer than `SHORT_UP_S`, so a short one is one drawn from the short table."""
    rng, rate = random.Random(7), 0.1
    gen = CHAIN.cycles(rate, rng)
    drawn = [next(gen) for _ in range(20_001)][1:]  # the first cycle is a remainder, not a full draw
    regimes_seen = [k for k, _, _ in drawn]
    shares, short_s, long_s, down_s = CHAIN.scales(rate)
    assert short_s == 1.0 and min(r.up[0] for r in CHAIN.regimes) * long_s > SHORT_UP_S
    for k, regime in enumerate(CHAIN.regimes):
        assert regimes_seen.count(k) / len(drawn) == pytest.approx(CHAIN.occupancy[k], abs=0.04)
        follows = [b for a, b in zip(regimes_seen, regimes_seen[1:], strict=False) if a == k]
        assert follows.count(k) / len(follows) == pytest.approx(regime.stay, abs=0.02)
        all_ups = [u for j, u, _ in drawn if j == k]
        short = [u for u in all_ups if u <= SHORT_UP_S]
        assert len(short) / len(all_ups) == pytest.approx(shares[k], abs=0.02)
        assert min(short) >= regime.up_short[0] and max(short) <= regime.up_short[-1]  # in seconds, as recorded
        ups = [u / long_s for u in all_ups if u > SHORT_UP_S]
        downs = [d / down_s for j, _, d in drawn if j == k]
        for table, xs in ((regime.up, ups), (regime.down, downs)):
            checks = _cdf_checks(table)
            assert checks, "no quantile to check"
            for q, value in checks:
                assert sum(x <= value for x in xs) / len(xs) == pytest.approx(q, abs=0.03)
    # the regimes differ: the first (bad spells) waits longer than the second on average
    assert CHAIN.regimes[0].downs.mean > 2 * CHAIN.regimes[1].downs.mean


@pytest.mark.parametrize("rate", [0.1, 0.4, 1.0])
def test_short_stretches_keep_their_recorded_seconds_at_every_rate(rate):
    """The recordings' blips (stretches with capacity of at most 15 minutes) are about as common at 0.1 as at 1.4
    interruptions per hour; the generated traces have the fitted share of them at each rate (the power law), a
    start of the #26 setting (660 s) finds no time to train in about that many stretches, and they are not
    stretched by 1 / rate (a model scaling every stretch by the rate has none shorter than a start at 0.1)."""
    traces = generated_traces(TraceSpec(rate, horizon_s=3000 * H / rate, fitted=True), 4, seed=8)
    ups = [b - a for t in traces for a, b in t[1:-1]]
    shares, _, long_s, _ = ESTIMATE_CHAIN.scales(rate)  # the estimate's traces are its model's
    expected = sum(p * q for p, q in zip(ESTIMATE_CHAIN.occupancy, shares, strict=True))
    assert expected == pytest.approx(short_share_at(rate), rel=0.01)
    longs_below = sum(p * (1 - q) * sum(v * long_s <= SHORT_UP_S for v in r.up) / len(r.up)
                      for p, q, r in zip(ESTIMATE_CHAIN.occupancy, shares, ESTIMATE_CHAIN.regimes, strict=True))
    assert sum(u <= SHORT_UP_S for u in ups) / len(ups) == pytest.approx(expected + longs_below, abs=0.03)
    below_start = sum(u < 660 for u in ups) / len(ups)
    assert below_start > 0.08  # the fitted tables: most blips are 585-600 s
    assert short_share_at(0.1) < short_share_at(1.0) < short_share_at(5.0) == short_share_at(50.0)


def test_past_the_fitted_rates_short_stretches_shrink_with_the_mean_and_the_rate_still_holds():
    """At 10 interruptions per hour (6 minutes of capacity on average) the short stretches' seconds shrink by
    1.39 / 10 so that the other stretches keep a positive scale; the rate asked for is still the traces' rate."""
    shares, short_s, long_s, _ = CHAIN.scales(10.0)
    assert short_s == pytest.approx(SHORT_FITTED_UP_TO_PER_HOUR / 10.0) and long_s > 0
    assert max(shares) < 0.95


def test_long_waits_for_capacity_come_in_runs():
    """Bunching, the point of the regimes: after a wait for capacity longer than the median, the next one is long
    more often than half the time (independent draws would give 50%; the fitted regimes differ most in their
    waits)."""
    traces = generated_traces(TraceSpec(0.5, horizon_s=2000 * H, fitted=True), 20, seed=4)
    downs = [[a2 - b for (_, b), (a2, _) in zip(t[1:-1], t[2:-1], strict=False)] for t in traces]
    median = statistics.median(d for seq in downs for d in seq)
    after_long = [b > median for seq in downs for a, b in zip(seq, seq[1:], strict=False) if a > median]
    assert sum(after_long) / len(after_long) > 0.55


def _known_chain_sequences(rng: np.random.Generator, stay: tuple[float, float], mu: np.ndarray, sd: np.ndarray,
                           n_seq: int, length: int) -> list[np.ndarray]:
    """Cycles (up, down) drawn from a two-state chain with log-normal stretches per state."""
    out = []
    for _ in range(n_seq):
        k, rows = int(rng.integers(2)), []
        for _ in range(length):
            rows.append(np.exp(rng.normal(mu[k], sd[k])))
            k = k if rng.random() < stay[k] else 1 - k
        out.append(np.array(rows))
    return out


def test_a_fit_on_traces_from_known_regimes_recovers_them():
    """Cycles drawn from known regimes (stay 0.9 / 0.8; log-normal ups and downs per regime): Baum-Welch recovers
    the switching probabilities and the per-regime log means, and the Viterbi-labelled tables recover each regime's
    stay and median stretches."""
    rng = np.random.default_rng(1)
    stay = (0.9, 0.8)
    mu = np.array([[-1.0, 0.5], [0.5, -1.5]])  # regime 0: short ups, long waits; regime 1: the reverse
    sd = np.array([[0.8, 0.8], [0.8, 0.6]])
    seqs = _known_chain_sequences(rng, stay, mu, sd, n_seq=4, length=300)
    _, trans, mu_fit, sd_fit, _ = fit_hmm([np.log(s) for s in seqs])
    order = np.argsort(-mu_fit[:, 1])  # the longer waits first, as the fit prints them
    assert np.diag(trans[order][:, order]) == pytest.approx(stay, abs=0.05)
    assert mu_fit[order] == pytest.approx(mu, abs=0.15)
    assert sd_fit[order] == pytest.approx(sd, abs=0.15)
    # on the waits alone (the model's regimes: far apart here) the same stays come back
    for k, r in enumerate(regimes(seqs, columns=(1,))):
        assert r["stay"] == pytest.approx(stay[k], abs=0.06)
    fitted = regimes(seqs)
    for k in range(2):
        assert fitted[k]["stay"] == pytest.approx(stay[k], abs=0.06)
        median_up, median_down = fitted[k]["up"][LEVELS.index(0.5)], fitted[k]["down"][LEVELS.index(0.5)]
        assert math.log(median_up) == pytest.approx(mu[k, 0], abs=0.2)
        assert math.log(median_down) == pytest.approx(mu[k, 1], abs=0.2)
    chain = Chain(tuple(Regime(stay=r["stay"], up=tuple(r["up"]), down=tuple(r["down"])) for r in fitted))
    assert chain.occupancy == pytest.approx((2 / 3, 1 / 3), abs=0.08)  # (1 - 0.8) / (0.1 + 0.2) in regime 0
    # short stretches marked on the same cycles, 40% of regime 0's and 10% of regime 1's (600 s or 780 s, the
    # others 2 h): each regime's share and short table in seconds come back from its labelled cycles
    states = [_states_of(s, mu) for s in seqs]
    short = [[bool(rng.random() < (0.4, 0.1)[k]) for k in st] for st in states]
    raw = [[float(rng.choice([600.0, 780.0])) if f else 7200.0 for f in fl] for fl in short]
    fitted = regimes(seqs, short, raw)
    for k in range(2):
        assert fitted[k]["short"] == pytest.approx((0.4, 0.1)[k], abs=0.06)
        assert (min(fitted[k]["up_short"]), max(fitted[k]["up_short"])) == (600.0, 780.0)
        assert fitted[k]["up"] == [7200.0] * len(LEVELS)


def _states_of(seq: np.ndarray, mu: np.ndarray) -> list[int]:
    """The nearer regime of each cycle by its log down (the regimes' waits are far apart here)."""
    return [int(abs(math.log(d) - mu[1, 1]) < abs(math.log(d) - mu[0, 1])) for d in seq[:, 1]]


def test_the_fits_quantiles_and_power_law_are_the_textbook_ones():
    rng = random.Random(2)
    xs = [rng.expovariate(1.0) for _ in range(501)]
    inclusive = statistics.quantiles(xs, n=50, method="inclusive")  # the stdlib's, at 1/50 .. 49/50
    assert quantiles(xs, LEVELS)[1:50] == pytest.approx(inclusive)
    assert quantiles(xs, LEVELS)[0] == min(xs) and quantiles(xs, LEVELS)[-1] == max(xs)
    c, beta = power_law([0.1, 0.5, 2.0], [3000 * r ** 0.4 for r in (0.1, 0.5, 2.0)])
    assert (c, beta) == (pytest.approx(3000), pytest.approx(0.4))


def test_the_fit_reads_a_recordings_cycles_and_skips_a_window_open_at_its_end():
    rec = Recording("r", [(0.0, 3600.0), (5400.0, 9000.0), (12600.0, 14400.0)], 14400.0)  # ends with capacity
    rate, mean_down, ups, downs = stretches(rec)
    assert rate == pytest.approx(3 / 2.5)  # 3 windows in 2.5 h with capacity
    assert mean_down == pytest.approx(2700.0)
    assert len(ups) == 2 and ups == pytest.approx([1.2, 1.2])  # the window open at the end was not interrupted
    assert downs == pytest.approx([1800 / 2700, 3600 / 2700])
    assert math.isfinite(sum(downs))
    # a blip of 10 minutes is short: kept in seconds; the others over their own mean, the open last window left out
    rec = Recording("r", [(0.0, 600.0), (5400.0, 9000.0), (12600.0, 19800.0), (21600.0, 22000.0)], 22000.0)
    flags, short_s, longs = blips(rec)
    assert flags == [True, False, False] and short_s == [600.0] and longs == pytest.approx([2 / 3, 4 / 3])


def test_a_regime_refuses_a_stay_probability_outside_0_1():
    with pytest.raises(ValueError, match="stay=1.0 is invalid"):
        Regime(stay=1.0, up=CHAIN.regimes[0].up, down=CHAIN.regimes[0].down)


def _normal_score_lags(seqs: list[list[float]], lags: tuple[int, ...]) -> list[float]:
    from benchmarks.fit_availability import lag_correlations
    return list(lag_correlations(seqs, lags))


def test_a_table_level_is_the_inverse_of_its_quantile_and_spreads_over_a_flat_step():
    table = Regime(stay=0.5, up=CHAIN.regimes[0].up, down=CHAIN.regimes[0].down, short=0.3,
                   up_short=CHAIN.regimes[0].up_short)
    rng = random.Random(1)
    for u in (0.013, 0.37, 0.5, 0.912, 0.996):
        assert table.ups.level(table.ups.quantile(u), rng) == pytest.approx(u, abs=1e-9)
    # 600 s is a flat step of the short table (an atom): its levels spread uniformly over the step's
    lo = LEVELS[table.up_short.index(600)]
    hi = LEVELS[len(table.up_short) - 1 - table.up_short[::-1].index(600)]
    levels = [table.shorts.level(600.0, rng) for _ in range(4000)]
    assert min(levels) >= lo and max(levels) <= hi
    assert statistics.fmean(levels) == pytest.approx((lo + hi) / 2, abs=0.01)


def test_stretches_with_capacity_persist_at_the_level_the_chain_is_given():
    """The stretches' normal scores k cycles apart correlate as share x lag1^k (the latent level's), whatever the
    regime; without a level they do not (the regimes now carry the waits only, and the stretches one table)."""
    regimes = tuple(Regime(stay=r.stay, up=r.up, down=r.down) for r in CHAIN.regimes)  # no short stretches
    for share, lag1 in ((0.5, 0.8), (0.0, 0.0)):
        rng, seqs = random.Random(3), []
        for _ in range(6):
            gen = Chain(regimes, share, lag1).cycles(0.3, rng)
            next(gen)
            seqs.append([next(gen)[1] for _ in range(4000)])
        got = _normal_score_lags(seqs, (1, 2, 4))
        assert got == pytest.approx([share * lag1 ** k for k in (1, 2, 4)], abs=0.03)


def test_a_stretch_with_capacity_hardly_depends_on_the_wait_after_it():
    """In the recordings the logarithms of a stretch with capacity and of the wait after it correlate -0.07 (the
    choose set, benchmarks/calibration_bench.py --cycles); regimes that drew both paired short stretches with long
    waits (-0.12). The fitted chain draws the stretches from one table for every regime of waits."""
    rng = random.Random(4)
    gen = CHAIN.cycles(0.3, rng)
    next(gen)
    cycles = [next(gen) for _ in range(20_000)]
    r = np.corrcoef([math.log(u) for _, u, _ in cycles], [math.log(d) for _, _, d in cycles])[0, 1]
    assert abs(r) < 0.06
    assert all(reg.up == CHAIN.regimes[0].up and reg.short == CHAIN.regimes[0].short for reg in CHAIN.regimes)


def test_the_level_fit_recovers_a_known_persistence():
    """Stretches drawn from a chain with a known level (share 0.3, lag-1 0.8): the fit's least squares over the
    correlations at 1-8 cycles apart finds them (its own draws are another seed)."""
    from benchmarks.fit_availability import level_persistence
    rng, rates, seqs = random.Random(5), [0.2, 0.5, 0.9, 0.3], []
    for rate in rates:
        gen = Chain(CHAIN.regimes, 0.3, 0.8).cycles(rate, rng)
        next(gen)
        seqs.append([next(gen)[1] for _ in range(2500)])
    share, lag1, target, got = level_persistence(seqs, rates, CHAIN.regimes, repeats=1, seed=9)
    assert share == pytest.approx(0.3, abs=0.08) and lag1 == pytest.approx(0.8, abs=0.08)
    assert got == pytest.approx(target, abs=0.05)


def test_a_chain_refuses_a_level_outside_0_1():
    with pytest.raises(ValueError, match="level_lag1=1.0 is invalid"):
        Chain(CHAIN.regimes, 0.2, 1.0)


def test_waits_persist_at_the_level_the_chain_is_given():
    """With regimes whose waits do not overlap (the calm one's all shorter), the waits' normal scores k cycles apart
    correlate as wait_share x wait_lag1^k (the latent level's); each regime keeps its share of the cycles and is
    kept from one cycle to the next as often as `implied_stays` says; the mean wait is the fitted one."""
    calm = tuple(0.05 + 0.2 * q for q in LEVELS)
    rough = tuple(0.5 + 3.0 * q for q in LEVELS)
    regimes = (Regime(stay=0.8, up=CHAIN.regimes[0].up, down=rough), Regime(stay=0.6, up=CHAIN.regimes[0].up,
                                                                           down=calm))
    for share, lag1 in ((0.4, 0.85), (0.0, 0.0)):
        chain = Chain(regimes, 0.0, 0.0, share, lag1)
        rng, seqs, ks = random.Random(6), [], []
        for _ in range(6):
            gen = chain.cycles(0.3, rng)
            next(gen)
            cycles = [next(gen) for _ in range(4000)]
            seqs.append([d for _, _, d in cycles])
            ks.append([k for k, _, _ in cycles])
        got = _normal_score_lags(seqs, (1, 2, 4))
        assert got == pytest.approx([share * lag1 ** k for k in (1, 2, 4)], abs=0.03)
        flat = [k for seq in ks for k in seq]
        assert flat.count(0) / len(flat) == pytest.approx(chain.occupancy[0], abs=0.03)
        for k in range(2):
            follows = [b for seq in ks for a, b in zip(seq, seq[1:], strict=False) if a == k]
            assert follows.count(k) / len(follows) == pytest.approx(chain.implied_stays[k], abs=0.02)
        assert statistics.fmean(d for seq in seqs for d in seq) == pytest.approx(mean_down_s(0.3), rel=0.05)
    # independent waits: each regime is kept as often as its share of the cycles
    assert Chain(regimes, wait_share=0.0).implied_stays == pytest.approx(Chain(regimes).occupancy)


# The recorded correlations of the waits' normal scores at 1-8 cycles apart on the 9 choose traces, as
# benchmarks/fit_availability.py --set choose prints them (the waits' level's target; docs/spot-policy.md).
RECORDED_WAIT_LAGS = (0.152, 0.121, 0.090, 0.089, 0.050, 0.077, 0.043, 0.041)


def test_the_waits_level_fitted_on_the_choose_set_reproduces_their_recorded_persistence():
    """The waits' own level as benchmarks/fit_availability.py fits it on the choose set (share 0.21, lag-1 0.84; not
    in `CHAIN`, whose calibration it did not improve: docs/spot-policy.md): the generated waits' normal scores
    correlate at 1-8 cycles apart as the recordings' do (within 0.04 at each lag, lag 1 within 0.03), and the
    regimes keep their shares of the cycles, each kept from one cycle to the next less often than the hidden Markov
    model's stay (0.68 / 0.43 against 0.910 / 0.839). `CHAIN`'s Markov chain at those stays makes the waits persist
    almost twice as much one cycle apart."""
    level = Chain(CHAIN.regimes, CHAIN.level_share, CHAIN.level_lag1, 0.21, 0.84)
    assert level.occupancy == CHAIN.occupancy
    assert level.implied_stays == pytest.approx((0.680, 0.429), abs=2e-3)

    def lags(chain: Chain) -> list[float]:
        rng, seqs = random.Random(8), []
        for rate in (0.15, 0.3, 0.6, 1.2):
            for _ in range(4):
                gen = chain.cycles(rate, rng)
                next(gen)
                seqs.append([next(gen)[2] for _ in range(1500)])
        return _normal_score_lags(seqs, tuple(range(1, 9)))

    got = lags(level)
    assert got == pytest.approx(RECORDED_WAIT_LAGS, abs=0.04)
    assert got[0] == pytest.approx(RECORDED_WAIT_LAGS[0], abs=0.03)
    assert lags(CHAIN)[0] > RECORDED_WAIT_LAGS[0] + 0.08


def test_the_wait_fit_recovers_a_known_persistence():
    """Waits drawn from the fitted regimes at a known level (share 0.3, lag-1 0.8): the fit's least squares over the
    correlations at 1-8 cycles apart finds them (its own draws are another seed)."""
    from benchmarks.fit_availability import wait_persistence
    rng, rates, seqs = random.Random(5), [0.2, 0.5, 0.9, 0.3], []
    for rate in rates:
        gen = Chain(CHAIN.regimes, 0.0, 0.0, 0.3, 0.8).cycles(rate, rng)
        next(gen)
        seqs.append([next(gen)[2] for _ in range(2000)])
    share, lag1, target, got = wait_persistence(seqs, rates, CHAIN.regimes, repeats=1, seed=9)
    assert share == pytest.approx(0.3, abs=0.08) and lag1 == pytest.approx(0.8, abs=0.08)
    assert got == pytest.approx(target, abs=0.05)


@pytest.mark.parametrize("field, value", [("wait_share", 1.0), ("wait_share", -0.1), ("wait_lag1", 1.0)])
def test_a_chain_refuses_a_wait_level_outside_0_1(field, value):
    with pytest.raises(ValueError, match=f"{field}={value!r} is invalid"):
        Chain(CHAIN.regimes, **{"wait_share": 0.2, field: value})


# Droughts and each trace's level of waits (Chain's `droughts`, `wait_level_sd`: measured, not in CHAIN).

def _bounded_regimes() -> tuple[Regime, Regime]:
    """Two regimes whose waits stay under 2.2x their tables' mean (0.87): at the mean waits below (3-4 h, the
    droughts' part taken out) every wait over DROUGHT_S is a drought."""
    return (Regime(stay=0.9, up=UP, down=tuple(0.2 + 2.0 * q for q in LEVELS)),
            Regime(stay=0.8, up=UP, down=tuple(0.1 + 0.2 * q for q in LEVELS)))


def _waits(chain: Chain, rate: float, cycles: int, seed: int, mean_wait_s: float | None = None) -> list[float]:
    gen = chain.cycles(rate, random.Random(seed), mean_wait_s)
    next(gen)  # the first cycle is a remainder
    return [next(gen)[2] for _ in range(cycles)]


@pytest.mark.parametrize("rate", [0.3, 1.2])
def test_the_generator_draws_the_fitted_droughts_at_their_share_and_quantiles_and_keeps_the_mean_wait(rate):
    chain = Chain(_bounded_regimes(), droughts=DROUGHTS, drought_share_at_one_per_hour=DROUGHT_SHARE_AT_ONE_PER_HOUR,
                  drought_rate_exponent=DROUGHT_SHARE_RATE_EXPONENT)
    waits = _waits(chain, rate, 200_000, 1, mean_wait_s=3 * H)
    droughts_ = [w for w in waits if w > DROUGHT_S]
    share = DROUGHT_SHARE_AT_ONE_PER_HOUR * rate ** DROUGHT_SHARE_RATE_EXPONENT
    assert len(droughts_) / len(waits) == pytest.approx(share, rel=0.08)
    for q in (0.1, 0.5, 0.9):
        assert quantiles(droughts_, (q,))[0] == pytest.approx(Stretches(DROUGHTS).quantile(q), rel=0.1)
    assert statistics.fmean(waits) == pytest.approx(3 * H, rel=0.05)
    # without droughts the same chain's waits never reach DROUGHT_S
    assert max(_waits(Chain(_bounded_regimes()), rate, 20_000, 1, mean_wait_s=3 * H)) < DROUGHT_S


def test_droughts_take_at_most_their_part_of_a_short_mean_wait():
    """At a recorded mean wait of 10 minutes the droughts are shortened to half of it; the mean wait holds."""
    share, drought_s, down_s = CHAIN_DROUGHTS.drought_scales(1.0, 600.0)
    assert share * Stretches(DROUGHTS).mean * drought_s == pytest.approx(0.5 * 600.0)
    assert statistics.fmean(_waits(CHAIN_DROUGHTS, 1.0, 100_000, 2, mean_wait_s=600.0)) == pytest.approx(600, rel=0.05)


def test_a_drought_fit_on_waits_drawn_with_a_known_share_recovers_it():
    table = tuple(15 * H + 15 * H * q for q in LEVELS)
    chain = Chain(_bounded_regimes(), droughts=table, drought_share_at_one_per_hour=0.05, drought_rate_exponent=0.5)
    rates = [0.2, 0.5, 1.0, 1.4]
    waits = [_waits(chain, r, 40_000, 3 + i, mean_wait_s=4 * H) for i, r in enumerate(rates)]
    c, beta, fitted = droughts(rates, waits)
    assert c == pytest.approx(0.05, rel=0.06)
    assert beta == pytest.approx(0.5, abs=0.06)
    assert fitted[len(LEVELS) // 2] == pytest.approx(22.5 * H, rel=0.03)
    with pytest.raises(ValueError, match="no wait over"):
        droughts([0.5], [[H, 2 * H]])


def test_each_trace_draws_its_own_level_of_waits_at_the_fitted_spread_not_with_a_recorded_mean():
    chain = dataclasses.replace(CHAIN_DROUGHTS, wait_level_sd=WAIT_LEVEL_SD)
    logs = [math.log(statistics.fmean(_waits(chain, 0.5, 2000, seed))) for seed in range(200)]
    # each trace's mean of 2,000 waits is within a few percent of its level's: the spread is the level's
    assert statistics.stdev(logs) == pytest.approx(WAIT_LEVEL_SD, rel=0.15)
    # the power law is fitted on logarithms: the median trace's mean wait is the law's
    assert statistics.median(logs) == pytest.approx(math.log(chain.laws.mean_down_s(0.5)), abs=0.1)
    recorded = [math.log(statistics.fmean(_waits(chain, 0.5, 3000, seed, mean_wait_s=H))) for seed in range(30)]
    assert statistics.stdev(recorded) < 0.1


def test_the_level_fit_recovers_a_known_spread_around_the_power_law():
    rng = random.Random(4)
    rates = [0.1 + 0.05 * i for i in range(200)]
    means = [900 * r ** 0.3 * math.exp(0.6 * rng.gauss(0, 1)) for r in rates]
    assert level_spread(rates, means) == pytest.approx(0.6, rel=0.12)
    assert level_spread(rates, [900 * r ** 0.3 for r in rates]) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("kwargs", [{"drought_share_at_one_per_hour": 0.0}, {"drought_share_at_one_per_hour": 1.0},
                                    {"drought_share_at_one_per_hour": 0.1, "wait_share": 0.3},
                                    {"drought_share_at_one_per_hour": 0.1, "wait_level_sd": -0.1}])
def test_a_chain_refuses_a_drought_share_outside_0_1_droughts_with_a_wait_level_and_a_negative_spread(kwargs):
    with pytest.raises(ValueError, match="invalid|not modelled"):
        Chain(REGIMES, droughts=DROUGHTS, **kwargs)


@pytest.mark.parametrize("model", [BOOTSTRAP, BOOTSTRAP_RECORDED_WAITS], ids=["power", "recorded"])
@pytest.mark.parametrize("rate", [0.1, 0.6, 1.4, 3.0])
def test_the_bootstrap_keeps_the_rate_asked_for_per_hour_with_capacity(model, rate):
    """Recorded cycles from recordings at 0.15-1.39 interruptions per hour, rescaled: the traces are interrupted at
    the run's rate (the same count over the same hours as the parametric model's test), at either end of the
    recorded rates and past them."""
    horizon = 3000 / rate * H  # about 2,000-3,000 cycles per trace
    rng = random.Random(3)
    traces = [fitted_trace(rate, horizon, rng, chain=model) for _ in range(30)]
    ends = sum(len(t) - 1 for t in traces)
    up_hours = sum(min(b, horizon) - a for t in traces for a, b in t if a < horizon) / H
    assert ends / up_hours == pytest.approx(rate, rel=0.05)


def _recorded_cycles() -> list[tuple[float, float, float]]:
    """(up_s, wait_s, its recording's rate) of every recorded cycle, read from the table as stored."""
    return [(flat[k], flat[k + 1], rate) for rate, flat in BOOTSTRAP.spells for k in range(0, len(flat), 2)]


@pytest.mark.parametrize("rate", [0.2, 0.9])
def test_the_bootstrap_draws_only_recorded_cycles_scaled_to_the_rate(rate):
    """Every cycle after the first is a recorded one: its wait the recorded seconds (recorded waits) or those times
    (rate / its recording's rate)^beta (power waits); its stretch with capacity a short one's recorded seconds, or a
    longer one's seconds times its recording's rate / the run's, all of those by one common factor."""
    cycles = _recorded_cycles()
    for model in (BOOTSTRAP, BOOTSTRAP_RECORDED_WAITS):
        gen = model.cycles(rate, random.Random(9))
        next(gen)  # the first is a remainder
        factors = set()
        for _ in range(3000):
            j, up, down = next(gen)
            up_s, wait_s, r = cycles[j]
            want = wait_s * (rate / r) ** DOWN_RATE_EXPONENT if model.waits == "power" else wait_s
            assert down == pytest.approx(want, rel=1e-12)
            if up_s <= SHORT_UP_S:
                assert up == up_s
            else:
                factors.add(round(up / (up_s * r / rate), 9))
        assert len(factors) == 1 and 0.8 < factors.pop() < 1.25  # one factor, near 1 (the rates are the recorded)


def test_the_bootstrap_keeps_runs_of_recorded_cycles_in_blocks_of_the_mean_length():
    """A cycle follows its predecessor in its recording except at a block's start (probability 1 / mean_block); all
    cycles are drawn about equally often."""
    following = BOOTSTRAP.following
    gen = BOOTSTRAP.cycles(0.5, random.Random(2))
    js = [next(gen)[0] for _ in range(100_000)]
    breaks = sum(b != following[a] for a, b in zip(js, js[1:], strict=False))
    assert len(js) / (breaks or 1) == pytest.approx(BOOTSTRAP.mean_block, rel=0.1)
    counts = [0] * len(following)
    for j in js:
        counts[j] += 1
    assert len(BOOTSTRAP.table) == 2036 and min(counts) > 0  # every recorded cycle drawn
    gen = Bootstrap(BOOTSTRAP.spells, mean_block=1.0).cycles(0.5, random.Random(2))
    js = [next(gen)[0] for _ in range(20_000)]
    kept = sum(b == following[a] for a, b in zip(js, js[1:], strict=False)) / len(js)
    assert kept < 0.01  # mean_block 1: every cycle drawn afresh (uniform: 1 in 2,036 follows its predecessor)


def test_a_bootstrap_trace_from_a_fixed_seed_reproduces_and_another_seed_differs():
    one = [fitted_trace(0.7, 300 * H, random.Random(5), chain=BOOTSTRAP) for _ in range(2)]
    other = fitted_trace(0.7, 300 * H, random.Random(6), chain=BOOTSTRAP)
    assert one[0] == one[1] and one[0] != other and len(one[0]) > 10
    assert generated_traces(TraceSpec(0.7, 300 * H, fitted=True), 3, seed=4) != [one[0]] * 3  # not the default's


def test_a_bootstrap_with_a_recorded_mean_wait_scales_its_waits_to_it_and_keeps_their_shape():
    """`mean_wait_s` (recorded, or the run's): the waits' mean is that, each wait the recorded one times one
    factor."""
    ups, downs = BOOTSTRAP_RECORDED_WAITS.scaled(0.5, mean_wait_s=7200.0)
    assert statistics.fmean(downs) == pytest.approx(7200.0)
    recorded = [w for _, w, _ in _recorded_cycles()]
    assert len({round(d / w, 9) for d, w in zip(downs, recorded, strict=True) if w}) == 1
    assert ups == BOOTSTRAP_RECORDED_WAITS.scaled(0.5)[0]  # the stretches with capacity unchanged


def test_a_bootstrap_job_is_created_at_a_random_moment_not_when_capacity_returns():
    rng = random.Random(11)
    traces = [fitted_trace(0.6, 200 * H, rng, chain=BOOTSTRAP) for _ in range(2000)]
    at_zero = sum(_available_at(t, 0.0) for t in traces) / len(traces)
    later = sum(_available_at(t, 100 * H) for t in traces) / len(traces)
    assert at_zero == pytest.approx(later, abs=0.04)
    assert 0.2 < at_zero < 0.95


def test_the_spells_fit_reads_a_recordings_cycles_in_seconds_and_skips_a_window_open_at_its_end():
    rec = Recording("r", [(0.0, 600.0), (5400.0, 9000.0), (12600.0, 19800.0), (21600.0, 22000.0)], 22000.0)
    rate, flat = spells(rec)
    assert rate == pytest.approx(4 / (11800 / H))  # 4 windows in 11,800 s with capacity
    assert flat == [600.0, 4800.0, 3600.0, 3600.0, 7200.0, 1800.0]


@pytest.mark.parametrize("kwargs, words", [
    ({"mean_block": 0.5}, "mean_block=0.5 is invalid: expected a number of cycles >= 1"),
    ({"waits": "model"}, "waits='model' is invalid: expected 'power' or 'recorded'"),
    ({"spells": ()}, "spells is empty"),
    ({"spells": ((0.0, (600.0, 60.0)),)}, "spells[0]: rate=0.0 is invalid"),
    ({"spells": ((0.5, (600.0,)),)}, "spells[0]: expected (up_s, wait_s) pairs"),
    ({"spells": ((0.5, (0.0, 60.0)),)}, "spells[0]: expected (up_s, wait_s) pairs"),
])
def test_a_bootstrap_refuses_a_short_block_an_unknown_waits_and_a_broken_table(kwargs, words):
    with pytest.raises(ValueError) as err:
        Bootstrap(**{"spells": BOOTSTRAP.spells, **kwargs})
    assert words in str(err.value)
