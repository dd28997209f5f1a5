"""What the estimate's simulation cannot resolve (spotrun/planner/ties.py): the standard errors a lead is measured
against, and how a tie breaks (the lower P95, then the fixed order)."""

from __future__ import annotations

from spotrun.planner.ties import NOISE_SES, by_tail, paired_se, se_of_mean, unpaired_se, unresolved


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
