"""Issue #26: the estimate's availability model is the one the fit command prints (benchmarks/fit_availability.py
`--model droughts-level`: CHAIN's procedure, the droughts and each trace's level of waits), printed as Python that is
the model exactly (`chain_source`)."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.fit_availability import chain_source
from spotrun.policy.availability import CHAIN, CHAIN_DROUGHTS_LEVEL, Chain, RateLaws, Regime


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
