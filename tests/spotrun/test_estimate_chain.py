"""Issue #26: the estimate's availability model is the one the fit command prints (benchmarks/fit_availability.py
`--model droughts-level`: CHAIN's procedure, the droughts and each trace's level of waits), printed as Python that is
the model exactly (`chain_source`)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from benchmarks.fit_availability import chain_source
from spotrun.policy import availability
from spotrun.policy.availability import (
    CHAIN,
    CHAIN_DROUGHTS_LEVEL,
    ESTIMATE_CHAIN,
    Chain,
    RateLaws,
    Regime,
    fitted_trace,
    mean_down_s,
    short_share_at,
)
from spotrun.policy.choose import ESTIMATE_TRACES
from spotrun.policy.traces import TraceSpec, generated_traces


def _source_chain(text: str, name: str) -> Chain:
    space = {"Chain": Chain, "Regime": Regime, "RateLaws": RateLaws}
    exec(text, space)  # the printed text, run as availability.py runs it once pasted
    return space[name]


def test_the_printed_model_is_the_fitted_one_exactly_and_fits_the_line_length():
    """Every field of a droughts-level chain, through the printed text and back: equal, lines within 120."""
    laws = RateLaws(7014, 0.319, 1.39, 0.325, 0.207)
    chain = dataclasses.replace(CHAIN_DROUGHTS_LEVEL, laws=laws, level_share=0.27, level_lag1=0.71,
                                drought_rate_exponent=0.995, wait_level_sd=0.51)
    text = chain_source(chain, "MODEL")
    assert _source_chain(text, "MODEL") == chain
    assert max(map(len, text.splitlines())) <= 120
    # another field's value changes the text: it is not printed from a template
    assert chain_source(dataclasses.replace(chain, wait_level_sd=0.5), "MODEL") != text


@pytest.mark.parametrize("chain, words", [
    (CHAIN, "expected a chain with droughts"),
    (dataclasses.replace(CHAIN_DROUGHTS_LEVEL, regimes=(CHAIN.regimes[0], dataclasses.replace(CHAIN.regimes[1],
                                                                                               short=0.2))),
     "one pooled table"),
])
def test_the_printer_refuses_a_chain_it_cannot_write_as_the_fit_fits_it(chain, words):
    with pytest.raises(ValueError, match=words):
        chain_source(chain, "MODEL")


def test_the_estimates_model_is_pasted_from_the_fit_commands_output():
    """availability.py holds `ESTIMATE_CHAIN` as the command prints it, character for character (an edit by hand to
    one constant, or a paste of another fit's, fails here); and it is the droughts-level model, not CHAIN's."""
    text = Path(availability.__file__).read_text()
    assert chain_source(ESTIMATE_CHAIN, "ESTIMATE_CHAIN") in text
    assert ESTIMATE_CHAIN.droughts is not None and ESTIMATE_CHAIN.wait_level_sd > 0
    assert ESTIMATE_CHAIN.regimes != CHAIN.regimes and ESTIMATE_CHAIN.laws != CHAIN.laws


def test_the_estimate_draws_its_traces_and_its_rate_laws_from_the_estimates_model():
    """The estimate's generated traces (choose.py's ESTIMATE_TRACES) are ESTIMATE_CHAIN's, draw for draw, not
    CHAIN's; the mean wait and share of blips it states come from ESTIMATE_CHAIN's power laws."""
    spec = TraceSpec(interruptions_per_hour=0.4, horizon_s=80 * 3600.0, **ESTIMATE_TRACES)
    drawn = generated_traces(spec, 5, seed=3)
    rng = random.Random(3)
    assert drawn == [fitted_trace(0.4, spec.horizon_s, rng, chain=ESTIMATE_CHAIN) for _ in range(5)]
    rng = random.Random(3)
    assert drawn != [fitted_trace(0.4, spec.horizon_s, rng, chain=CHAIN) for _ in range(5)]
    for rate in (0.1, 0.4, 1.2):
        assert mean_down_s(rate) == ESTIMATE_CHAIN.laws.mean_down_s(rate) != CHAIN.laws.mean_down_s(rate)
        assert short_share_at(rate) == ESTIMATE_CHAIN.laws.short_share_at(rate) != CHAIN.laws.short_share_at(rate)


def test_the_printed_average_wait_is_the_generated_traces_mean():
    """The estimate's line said 'waits for capacity of 1.1 h on average' at 0.15 interruptions per job-hour from the
    power law, which is fitted on logarithms (the median trace's mean wait); each trace draws its own level, so the
    traces' mean wait averaged over them is x1.14 that. The figure printed is now the traces' own average, measured
    here on generated traces (3,000 h each: a trace's mean over ~400 waits)."""
    from statistics import mean, stdev

    from spotrun.policy.choose import fitted_source

    rate, rng = 0.15, random.Random(11)
    per_trace = []
    for _ in range(1500):
        trace = fitted_trace(rate, 3000 * 3600.0, rng)
        waits = [b[0] - a[1] for a, b in zip(trace, trace[1:], strict=False)]
        per_trace.append(mean(waits))
    measured, se = mean(per_trace) / 3600, stdev(per_trace) / 3600 / len(per_trace) ** 0.5
    printed = float(fitted_source(rate).split("waits for capacity of ")[1].split(" h on average")[0])
    assert abs(printed - measured) <= max(3 * se, 0.05), (printed, measured, se)  # to its printed tenth
    assert abs(mean_down_s(rate) / 3600 - measured) > 3 * se, (mean_down_s(rate) / 3600, measured, se)  # the median's
