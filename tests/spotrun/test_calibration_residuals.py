"""benchmarks/calibration_bench.py --cells and benchmarks/calibration_residuals.py: the cells file holds what the
bench printed, the bias correction for a recording is fitted on the other recordings only, and the standard errors
count a recording's overlapping windows as one draw."""

import json
import sys

import pytest

from benchmarks import calibration_residuals as res


def _data(rows: list[tuple[int, float, int]], n: int = 1000) -> dict:
    """A cells file of one cell: windows (recording, its estimate's P, met 0/1)."""
    recs = sorted({i for i, _, _ in rows})
    est = [{"met": next(p for i, p, _ in rows if i == k), "late": 0.0, "ended": 0.0, "bill": 1.0, "od_h": 0.0,
            "spot_h": 1.0, "finish_h": 1.0} for k in range(max(recs) + 1)]
    windows = [[i, {"met": float(m), "late": 0.0, "ended": 1.0 - m, "bill": 1.0, "od_h": 0.0, "spot_h": 1.0,
                    "finish_h": 1.0 if m else None}] for i, _, m in rows]
    return {"set": "loo", "model": "droughts-level", "seed": 0, "n": n, "every_h": 6.0,
            "recordings": [f"r{k}" for k in range(max(recs) + 1)],
            "deadlines": {"48": {"p (notice)": {"estimated": est, "windows": windows}}}}


def test_a_recordings_correction_is_fitted_on_the_other_recordings_only():
    """Recording 0 over-promises by 40 points, 1 and 2 are exact: recording 0's correction (fitted on 1 and 2)
    takes nothing off; 1's and 2's take off recording 0's share of what they were fitted on; changing recording
    0's own outcomes leaves its correction as it was."""
    rows = [(0, 0.9, 1), (0, 0.9, 0)] + [(k, 0.5, m) for k in (1, 2) for m in (1, 0)]
    all_cells = res.cells(_data(rows))
    for kind in res.CORRECTIONS:
        fix0 = res.correction(all_cells, kind, 0, "48", "p (notice)")
        assert fix0(0, 0.9) == pytest.approx(0.9), kind
    fix1 = res.correction(all_cells, "cell", 1, "48", "p (notice)")
    assert fix1(1, 0.5) == pytest.approx(0.3)  # the windows of 0 and 2: -0.1, +0.9, -0.5, +0.5: 0.2 taken off
    flipped = res.cells(_data([(0, 0.9, 0), (0, 0.9, 0)] + rows[2:]))
    for kind in res.CORRECTIONS:
        assert res.correction(flipped, kind, 0, "48", "p (notice)")(0, 0.9) == pytest.approx(0.9), kind


def test_the_clustered_error_counts_a_recordings_copies_once_the_binomial_does_not():
    """Each window repeated 4 times in its own recording: the binomial standard error halves (4 times the windows),
    the one clustered by recording stays (the copies are no new draws)."""
    rows = [(k, 0.5, m) for k, m in enumerate([1, 0, 1, 1, 0, 1, 0, 1])]
    once = res.standard_errors(res.cells(_data(rows))[0][2])
    copies = res.standard_errors(res.cells(_data([r for r in rows for _ in range(4)]))[0][2])
    assert copies[0] == pytest.approx(once[0] / 2)
    assert copies[1] == pytest.approx(once[1]) and copies[2] == pytest.approx(once[2])
    assert once[1] > once[0]  # G / (G - 1) and n - 1: the clustered one is never below the binomial with singletons


def test_residuals_refuse_a_file_that_is_not_a_cells_file(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit) as stop:
        res.main([str(bad)])
    assert str(stop.value) == f"{bad}: not a calibration_bench.py --cells file (no recordings, deadlines and n)"
    bad.write_text("{")
    with pytest.raises(SystemExit) as stop:
        res.main([str(bad)])
    assert "cannot read it as JSON" in str(stop.value) and "Expecting" not in str(stop.value)


def _bench(tmp_path, monkeypatch, capsys, *argv):
    from benchmarks.calibration_bench import main
    trace = tmp_path / "availability/1-node/a/z.json"
    trace.parent.mkdir(parents=True, exist_ok=True)
    data = ([1] * 60 + [0] * 4 + [1, 0] + [1] * 20 + [0] * 40) * 20  # calm spells and 6.7 h droughts
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": data}))
    monkeypatch.setattr(sys, "argv", ["calibration_bench.py", "--spot-traces", str(tmp_path), *argv])
    main()
    return capsys.readouterr().out


def test_cells_file_holds_the_runs_the_bench_printed(tmp_path, monkeypatch, capsys):
    """The cells file's windows and the means of its recordings' estimates are the printed table's windows and
    estimated P(deadline), and its windows' runs its observed frequency and share ended at the cap."""
    cells = tmp_path / "cells.json"
    out = _bench(tmp_path, monkeypatch, capsys, "--set", "all", "--n", "40", "--every-h", "12", "--deadlines", "48",
                 "--cap-x", "0.8", "--policies", "deadline_greedy,uniform_progress", "--cells", str(cells))
    data = json.loads(cells.read_text())
    printed = [line.split(" | ") for line in out.splitlines() if line.startswith("| 48 h |")]
    assert len(printed) == 2
    for row in printed:
        cell = data["deadlines"]["48"][row[2]]
        windows = cell["windows"]
        assert len(windows) == int(row[3])
        est = sum(cell["estimated"][i]["met"] for i, _ in windows) / len(windows)
        obs = sum(f["met"] for _, f in windows) / len(windows)
        ended = sum(f["ended"] for _, f in windows) / len(windows)
        assert f"{est:.1%}" == row[4] and f"{obs:.1%}" == row[5]
        assert row[8].rstrip(" |").endswith(f"/ {ended:.1%}")
    assert 0 < obs < 1 or 0 < ended < 1  # the setting is one the cap binds in, not a trivial one


def test_cells_needs_a_cap(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as stop:
        _bench(tmp_path, monkeypatch, capsys, "--cells", str(tmp_path / "c.json"))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--cells writes the calibration's runs at a cap: give --cap-usd or --cap-x" in err
    assert "Traceback" not in err


def test_drop_leaves_a_recordings_windows_out_and_refuses_an_unknown_name():
    """Without recording 0 (over-promised by 40 points) the cell is exact; a name not in the file is refused."""
    data = _data([(0, 0.9, 1), (0, 0.9, 0)] + [(k, 0.5, m) for k in (1, 2) for m in (1, 0)])
    assert res.difference(res.cells(data)[0][2]) == pytest.approx(40 / 3)
    assert res.difference(res.cells(res.drop(data, ["r0"]))[0][2]) == pytest.approx(0.0)
    with pytest.raises(SystemExit) as stop:
        res.drop(data, ["r9"])
    assert str(stop.value) == "--drop r9: not a recording of the cells file (names as DIR/stem, e.g. r0)"


def test_the_per_recording_error_shows_what_the_pooled_cell_hides():
    """Two recordings off by +20 and -20 points: the pooled cell reads 0, each recording's own cell 20."""
    rows = [(0, 0.7, m) for m in (1, 0)] + [(1, 0.3, m) for m in (1, 0)]
    windows = res.cells(_data(rows))[0][2]
    assert res.difference(windows) == pytest.approx(0.0)
    assert res.per_recording_error(windows) == pytest.approx(20.0)


def test_recordings_refuses_a_name_not_among_the_set(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as stop:
        _bench(tmp_path, monkeypatch, capsys, "--set", "all", "--recordings", "a/nope", "--unavailable", "5")
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--recordings a/nope: not among the 1 recordings of --set all (names as DIR/stem, e.g. a/z)" in err


@pytest.mark.parametrize("table", ["stretches", "unavailable"])
def test_the_diagnostics_draw_each_recordings_traces_from_its_own_fold(monkeypatch, table):
    """`--stretches` and `--unavailable` with `--set loo`: recording k's generated traces come from models[k]."""
    import benchmarks.calibration_bench as bench
    from benchmarks.policy_bench import setting
    from spotrun.policy import traces as _traces
    from tests.spotrun.test_calibration_bench import _recording
    recs = [_recording(f"r{k}", 0.4, 20 + k) for k in range(2)]
    used = []

    def generated(spec, n, seed):
        used.append(_traces.fitted_trace.keywords["chain"])
        return [[(0.0, 3600.0), (7200.0, 10800.0), (14400.0, 1e12)]] * n
    monkeypatch.setattr(bench, "generated_traces", generated)
    models = [bench.MODELS["bootstrap"], bench.MODELS["droughts"]]
    try:
        if table == "stretches":
            bench.stretch_rows(setting(48), recs, ["r0", "r1"], 3, models=models)
        else:
            bench.unavailable_rows(recs, 48, 12, 3, "loo", models=models)
    finally:
        bench.use_model("regimes")
    assert used == models


def test_seeds_states_each_cells_mean_over_the_seeds_and_their_summary():
    """Two cells, seeds 0 and 1 (the same windows, observed 50%): 48 h reads +4 then 0 points, 80 h +1 then +7. The
    seeds' table gives each cell's mean over the seeds (+2.00, +4.00) and, over the cells, the mean and the largest
    of those means (+3.00, +4.0), not the first seed's (+2.50, +4.0 at 48 h)."""
    def seeded(seed: int, p48: float, p80: float) -> dict:
        data = _data([(0, p48, 1), (0, p48, 0)])
        data["deadlines"]["80"] = _data([(0, p80, 1), (0, p80, 0)])["deadlines"]["48"]
        return {**data, "seed": seed}
    rows = res.seed_rows([seeded(0, 0.54, 0.51), seeded(1, 0.50, 0.57)])
    assert "difference at seeds 0 1 (points) | mean over the seeds |" in rows[0], rows[0]
    cell48, = [r for r in rows if r.startswith("| 48 h |")]
    cell80, = [r for r in rows if r.startswith("| 80 h |")]
    assert cell48.endswith("| +4.0 +0.0 | +2.00 |") and cell80.endswith("| +1.0 +7.0 | +4.00 |"), (cell48, cell80)
    assert rows[-1] == "| 2 | +3.00 | 3.00 | +4.0 | 0 of 2 |", rows[-1]
    assert "mean over the seeds 0 1: mean (points)" in rows[-3], rows[-3]
