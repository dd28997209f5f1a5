"""What the estimate's simulation cannot resolve (spotrun/planner/ties.py): the standard errors a lead is measured
against, and how a tie breaks (the lower P95, then the fixed order)."""

from __future__ import annotations

from spotrun.planner.ties import NOISE_SES, by_tail, paired_se, se_of_mean, tied_with_least, unpaired_se, unresolved


def test_the_standard_errors_on_known_samples():
    assert se_of_mean([0.0, 2.0]) == 1.0  # sd sqrt(2), over sqrt(2)
    assert se_of_mean([5.0]) == 0.0
    # the same bills but one trace: the paired difference is one $4 trace of four (sd 2 over sqrt(4))
    assert paired_se([1.0, 2.0, 3.0, 7.0], [1.0, 2.0, 3.0, 3.0]) == 1.0
    assert paired_se([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert unpaired_se(3.0, 4.0) == 5.0


def test_a_lead_is_a_tie_within_half_a_cent_or_the_noise():
    assert unresolved(0.004, 0.0) and not unresolved(0.006, 0.0)
    assert unresolved(NOISE_SES * 1.5 - 0.01, 1.5) and not unresolved(NOISE_SES * 1.5 + 0.01, 1.5)


def test_a_tie_breaks_by_the_lower_p95_then_the_order():
    # (name, mean, p95): the least mean "a"; "b" within its noise with a lower P95, "c" a resolved lead behind
    items = [("a", 100.0, 300.0), ("b", 101.0, 200.0), ("c", 110.0, 100.0), ("d", 101.5, 200.004)]
    chosen, least = by_tail(items, lambda x: x[1], lambda x: x[2], lambda x, y: 1.0)
    assert (chosen[0], least[0]) == ("b", "a")
    # "d" ties "b"'s P95 to half a cent at a lower mean: the order, not the mean, breaks it
    chosen, _ = by_tail([items[0], items[3], items[1]], lambda x: x[1], lambda x: x[2], lambda x, y: 1.0)
    assert chosen[0] == "d"
    chosen, _ = by_tail(items, lambda x: x[1], lambda x: x[2], lambda x, y: 0.0)  # no noise: the least mean
    assert chosen[0] == "a"


def test_rows_printing_the_chosen_ones_cents_are_tied_with_it():
    """mistral at 14.25 h: the least mean $18.264 (printed $18.26), one $18.268 within half a cent of it, one $18.272
    at the same printed $18.27 but 0.8 cents over the least: the third was not tied, and two rows printing $18.27
    were one chosen, one not named. The half cent measured from the least left it out; the printed cents do not."""
    items = [("least", 18.264, 30.0), ("near", 18.268, 20.0), ("same cents", 18.272, 10.0), ("far", 18.29, 1.0)]
    no_noise = lambda x, y: 0.0  # noqa: E731 (paired on the same traces, no spread)
    tied = tied_with_least(items, lambda x: x[1], no_noise)
    assert [x[0] for x in tied] == ["least", "near", "same cents"]  # "far" prints $18.29: a lead, not a tie
    chosen, least = by_tail(items, lambda x: x[1], lambda x: x[2], no_noise)
    assert (chosen[0], least[0]) == ("same cents", "least")  # the lowest P95 of the three tied
