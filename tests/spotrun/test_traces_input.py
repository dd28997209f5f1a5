"""What `spotrun simulate` does with what a user hands it (issue 26, "fast and safe where users meet it"): bad trace
and interruption files are refused in one line naming the file, the field, what was found and what is accepted,
never in Python's words; a directory's recordings without capacity for the run's node count are left out and
named; the progress bar is drawn only on a terminal; the plot's probability axis ends at 100%."""

from __future__ import annotations

import io
import json

import pytest

from spotrun.policy.traces import (
    NoCapacity,
    TraceFileError,
    interruption_gaps,
    read_availability,
    read_recordings,
)
from tests.spotrun.pipeline_inputs import tiny_run

# Python's and the JSON decoder's own words, which a user's message must not carry
INTERNALS = ("could not convert", "invalid literal", "codec", "list indices", "KeyError", "Errno", "(char ",
             "object is not", "NoneType", "not subscriptable", "Traceback", "IndexError", "ValueError")
GOOD = {"metadata": {"gap_seconds": 600}, "data": [1, 1, 0, 1] * 10}


def _write(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize("content, expected", [
    ("", "the file is empty: expected a spot-traces file"),
    ("  \n ", "the file is empty"),
    (bytes(range(128, 256)) * 8, "not text (byte 0 is not UTF-8: a binary file?)"),
    ('{"metadata": {"gap_seconds": 600}, "data": [1, 0\n',
     "not valid JSON (at line 1 column 49: expected more: the text ends inside an object or array"),
    ([1, 0, 1], "the document is an array: expected an object {\"metadata\""),
    ({"metadata": {"gap_seconds": 600}}, 'no "data" field: expected an object'),
    ({"data": [1, 0]}, 'no "metadata" field'),
    ({"metadata": [600], "data": [1, 0]}, "metadata is invalid (it is an array): expected an object"),
    ({"metadata": {"gap": 600}, "data": [1, 0]}, "metadata is invalid (no gap_seconds in it)"),
    ({"metadata": {"gap_seconds": 600}, "data": "1,0,1"}, 'data is invalid (the string "1,0,1"): expected an array'),
    ({"metadata": {"gap_seconds": 600}, "data": [1, 0.5, 1]}, "data[1]=0.5 is invalid: expected a whole count"),
    ({"metadata": {"gap_seconds": 600}, "data": [1, 1, "x"]}, 'data[2]="x" is invalid: expected a whole count'),
    ('{"metadata": {"gap_seconds": 600}, "data": [1, NaN]}', "data[1]=NaN is invalid"),
    ('{"metadata": {"gap_seconds": Infinity}, "data": [1]}', "metadata.gap_seconds=Infinity is invalid: expected a "
     "number of seconds from 1 to 86400"),
    ({"metadata": {"gap_seconds": 600}, "data": [1, -2]}, "data[1]=-2 is invalid"),
])
def test_a_bad_trace_file_is_refused_naming_the_file_the_field_and_what_is_accepted(tmp_path, content, expected):
    path = _write(tmp_path / "zone-a.json", content)
    with pytest.raises(TraceFileError) as exc:
        read_availability(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: ") and expected in message, message
    lines = 3 if "not valid JSON" in expected else 1  # the message; JSON's line with a caret under the column
    assert message.count("\n") == lines - 1 and not any(word in message for word in INTERNALS), message


def test_whole_counts_written_as_floats_are_counts(tmp_path):
    """1.0 is a count of one (a writer that stores floats): only a fraction is refused."""
    path = _write(tmp_path / "t.json", {"metadata": {"gap_seconds": 600}, "data": [1.0, 0.0, 2.0]})
    assert read_availability(path, 2).windows == [(1200.0, 1800.0)]


def test_a_directory_names_every_broken_file_and_leaves_out_only_recordings_without_the_capacity(tmp_path):
    _write(tmp_path / "a-good.json", GOOD)
    _write(tmp_path / "b-empty.json", "")
    _write(tmp_path / "c-text.json", {"metadata": {"gap_seconds": 600}, "data": [1, "one"]})
    with pytest.raises(TraceFileError) as exc:
        read_recordings(sorted(tmp_path.glob("*.json")))
    message = str(exc.value)
    assert message.startswith("2 of 3 trace files are not recordings: ") and "b-empty.json: the file is empty" in \
        message and 'c-text.json: data[1]="one" is invalid' in message and "a-good" not in message, message

    two = tmp_path / "two"
    two.mkdir()
    _write(two / "one-node.json", GOOD)  # at most 1 available: nothing for a 2-node job
    _write(two / "two-node.json", {"metadata": {"gap_seconds": 600}, "data": [2, 2, 1, 0] * 10})
    recs, left = read_recordings(sorted(two.glob("*.json")), instances=2)
    assert [r.name for r in recs] == ["two-node.json"] and [x.path.name for x in left] == ["one-node.json"]
    assert left[0].reason == "no sample has 2 instances available, the most is 1" and left[0].most == 1
    recs, left = read_recordings(sorted(two.glob("*.json")), instances=1)  # both serve a 1-node job
    assert len(recs) == 2 and left == []
    with pytest.raises(TraceFileError, match=r"^none of the 2 trace files has capacity for the job: no sample has 3 "
                       r"instances available in any \(the most is 2\); expected recordings of at least 3 nodes$"):
        read_recordings(sorted(two.glob("*.json")), instances=3)
    with pytest.raises(NoCapacity, match="the most is 1"):
        read_availability(two / "one-node.json", 2)


@pytest.mark.parametrize("item, expected", [
    ({"kind": "interruption", "sk": "INTERRUPTED#100"}, "items[1]: pk=null is invalid: expected the job's name"),
    ({"kind": "interruption", "pk": "j", "sk": "INTERRUPTED#abc"}, 'items[1] (job "j"): sk="INTERRUPTED#abc" is '
     'invalid: expected "INTERRUPTED#" and the interruption\'s time in epoch seconds, 0 or more'),
    ({"kind": "interruption", "pk": "j", "sk": "INTERRUPTED"}, 'items[1] (job "j"): sk="INTERRUPTED" is invalid'),
    ({"kind": "interruption", "pk": "j", "sk": "INTERRUPTED#-5"}, 'items[1] (job "j"): sk="INTERRUPTED#-5" is invalid'),
    ({"kind": "interruption", "pk": "j", "sk": "INTERRUPTED#nan"}, 'items[1] (job "j"): sk="INTERRUPTED#nan" is '
     'invalid'),
    ({"kind": "interruption", "pk": "j", "sk": "INTERRUPTED#inf"}, 'items[1] (job "j"): sk="INTERRUPTED#inf" is '
     'invalid'),
    ({"kind": "interruption", "pk": "j", "sk": 7}, 'items[1] (job "j"): sk=7 is invalid'),
])
def test_a_bad_interruption_item_is_refused_naming_the_item_and_its_field(item, expected):
    first = {"kind": "interruption", "pk": "j", "sk": "INTERRUPTED#50"}
    with pytest.raises(ValueError) as exc:
        interruption_gaps([first, item])
    assert str(exc.value).startswith(expected) and not any(w in str(exc.value) for w in INTERNALS), str(exc.value)


def test_interruptions_in_any_order_give_the_gaps_between_each_jobs_consecutive_ones():
    items = [{"kind": "interruption", "pk": "j", "sk": f"INTERRUPTED#{t}"} for t in (5000, 100, 9000)]
    items.append({"kind": "performance", "pk": "j", "sk": "PERFORMANCE"})  # not an interruption: not read
    assert sorted(interruption_gaps(items)) == [4000.0, 4900.0]


def _run(tmp_path, **compute):
    run = tmp_path / "run.json"
    run.write_text(json.dumps(tiny_run(**compute)))
    return run


@pytest.mark.parametrize("name, content, expected", [
    ("empty.json", "", "the file is empty: expected a JSON array of the interruption table's items"),
    ("bin.json", b"\xff\xfe\x00garbage", "not text (byte 0 is not UTF-8"),
    ("cut.json", '[{"kind": "interruption",\n', "not valid JSON (at line 1 column 26: expected a field name in double "
     "quotes or '}', but the text ends here"),
    ("comma.json", '[{"kind": "interruption" "pk": "j"}]', "not valid JSON (at line 1 column 26: expected a ',' "
     "between this and what comes before it, or '}' to end the object)"),
    ("obj.json", {"Items": 5}, 'the document is an object without an "Items" array'),
    ("text.json", [{"kind": "interruption", "pk": "j", "sk": "INTERRUPTED#soon"}], 'items[0] (job "j"): '
     'sk="INTERRUPTED#soon" is invalid'),
    # a new user's items as the docs showed them, without the recorder's kind: "no recorded gaps" said nothing of it
    ("nokind.json", [{"pk": "j", "sk": "INTERRUPTED#100"}, {"pk": "j", "sk": "INTERRUPTED#4000"}],
     '2 items, none with kind="interruption" (the interruption recorder\'s items carry it, beside pk and sk)'),
    ("once.json", [{"kind": "interruption", "pk": "a", "sk": "INTERRUPTED#100"},
                   {"kind": "interruption", "pk": "b", "sk": "INTERRUPTED#200"}],
     "2 interruption items over 2 jobs, none interrupted twice at different times"),
])
def test_spotrun_simulate_refuses_a_bad_interruptions_file_in_one_line(tmp_path, capsys, name, content, expected):
    from spotrun.cli.main import main

    path = _write(tmp_path / name, content)
    assert main(["simulate", str(_run(tmp_path)), "--interruptions", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: InvalidArguments: --interruptions={path}: {expected}"), err
    lines = 3 if "not valid JSON" in expected else 1  # the message; JSON's line with a caret under the column
    assert err.count("\n") == lines and not any(w in err for w in INTERNALS + ("Expecting",)), err


def test_spotrun_simulate_leaves_out_recordings_without_the_runs_node_count_and_says_which(tmp_path, capsys):
    from spotrun.cli.main import main

    traces = tmp_path / "traces"
    (traces / "1-node").mkdir(parents=True)
    (traces / "2-node").mkdir()
    _write(traces / "1-node" / "zone-a.json", GOOD)
    _write(traces / "2-node" / "zone-a.json", {"metadata": {"gap_seconds": 600}, "data": ([2] * 30 + [1] * 5) * 20})
    run = _run(tmp_path, instance_count=2)
    out = tmp_path / "out"
    assert main(["simulate", str(run), "--traces", str(traces), "--n", "10", "--no-optimum", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert ("1 recorded trace from random start offsets, 86% available on average; left out 1 of 2 trace files in "
            "which no sample has 2 instances available (the most is 1): 1-node/zone-a.json") in text, text
    report = json.loads((out / "simulate.json").read_text())
    assert report["traces_left_out"] == [{"file": str(traces / "1-node" / "zone-a.json"),
                                          "reason": "no sample has 2 instances available, the most is 1"}]
    # none fits: refused naming the count, exit 2
    assert main(["simulate", str(run), "--traces", str(traces / "1-node"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: InvalidArguments: --traces={traces / '1-node'}: {traces / '1-node' / 'zone-a.json'}: no "
                   "capacity at all for the job: no sample has 2 instances available (the most is 1); a spot job "
                   "would wait on this trace forever\n"), err


def test_spotrun_simulate_refuses_a_directory_with_broken_files_naming_each(tmp_path, capsys):
    from spotrun.cli.main import main

    traces = tmp_path / "traces"
    traces.mkdir()
    _write(traces / "good.json", GOOD)
    _write(traces / "bad.json", b"\x89PNG\r\n\x1a\n")
    (traces / "folder.json").mkdir()  # a directory named *.json is no trace file: not read, not refused
    assert main(["simulate", str(_run(tmp_path)), "--traces", str(traces), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: InvalidArguments: --traces={traces}: {traces / 'bad.json'}: not text (byte 0 is not "
                   'UTF-8: a binary file?): expected a spot-traces JSON file {"metadata": {"gap_seconds": N}, '
                   '"data": [instances available, ...]}\n'), err
    only_dirs = tmp_path / "only-dirs"
    (only_dirs / "x.json").mkdir(parents=True)
    assert main(["simulate", str(_run(tmp_path)), "--traces", str(only_dirs), "--out", str(tmp_path / "o")]) == 2
    assert "no *.json trace files under it" in capsys.readouterr().err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_is_drawn_only_on_a_terminal(monkeypatch):
    """Redrawn with carriage returns, a bar in a CI log or `2> file` is noise: nothing is written there."""
    from spotrun.cli import simulate

    monkeypatch.setattr(simulate, "PROGRESS_AFTER_S", 0.0)
    piped, tty = io.StringIO(), _Terminal()
    for stream in (piped, tty):
        progress = simulate.Progress(stream)
        for done in range(1, 4):
            progress("policies", done, 3)
    assert piped.getvalue() == ""
    assert tty.getvalue().endswith(f"\rpolicies [{'#' * 30}] 3/3\n")


def test_the_plots_probability_axis_ends_at_100_percent(tmp_path, monkeypatch):
    """Points at P = 1.0 made matplotlib's margins run the axis to 100.15% (or 105.5% with one point)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from spotrun.policy.report import plot, probability_axis

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    rows = [{"label": "a", "p_deadline": 1.0, "p_finished": 1.0, "mean_usd": 3.0},
            {"label": "b", "p_deadline": 0.97, "p_finished": 1.0, "mean_usd": 2.0}]
    for report in ({"policies": rows, "chosen": "a", "deadline_hours": 48,
                    "optimum": {"mean_usd": 1.5, "p_deadline": 1.0}},
                   {"policies": rows[:1], "chosen": "a", "deadline_hours": None}):
        plot(report, tmp_path / "p.png", "t")
    lows = [fig.axes[0].get_xlim()[0] for fig in figures]
    assert [fig.axes[0].get_xlim()[1] for fig in figures] == [1.0, 1.0]
    assert 0.9 < lows[0] < 0.97 and 0.9 < lows[1] < 1.0, lows  # the lowest point is inside, with room
    shown = figures[0].axes[0].xaxis.get_major_formatter()(1.0, 0)  # in percent: 100% or 100.00%
    assert shown.endswith("%") and float(shown.rstrip("%")) == 100.0, shown
    assert probability_axis([0.0, 0.5]) == (0.0, 1.0)


@pytest.mark.parametrize("flag, value, expected", [
    ("--n", "10.5", "--n=10.5 is invalid: expected a whole number (e.g. 1000)"),
    ("--n", "1e3", "--n=1e3 is invalid: expected a whole number (e.g. 1000)"),
    ("--seed", "1.5", "--seed=1.5 is invalid: expected a whole number (e.g. 1000)"),
    ("--droughts", "nan", "--droughts=nan is invalid: expected a number of droughts per day from 0 to 24"),
])
def test_simulate_refuses_a_count_that_is_not_whole_naming_the_flag_and_value(tmp_path, capsys, flag, value, expected):
    """Guards (these were refused before issue 26's trial too): a count flag takes whole numbers only."""
    from spotrun.cli.main import main

    try:
        code = main(["simulate", str(_run(tmp_path)), flag, value, "--out", str(tmp_path / "o")])
    except SystemExit as exc:  # argparse's own refusals exit
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: InvalidArguments: {expected}") and err.count("\n") == 1, err


def test_spotrun_simulate_says_when_a_few_recorded_gaps_are_all_its_traces_repeat(tmp_path, capsys):
    """A new user: one recorded gap gave '1000 traces (resampled from 1 recorded gap ...)' with no word that every
    trace repeats that one gap."""
    from spotrun.cli.main import main

    path = _write(tmp_path / "one.json", [{"kind": "interruption", "pk": "j", "sk": "INTERRUPTED#100"},
                                          {"kind": "interruption", "pk": "j", "sk": "INTERRUPTED#7300"}])
    out = tmp_path / "out"
    assert main(["simulate", str(_run(tmp_path)), "--interruptions", str(path), "--n", "10", "--no-optimum",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert ("resampled from 1 recorded gap between interruptions; only 1: every trace repeats it, so the odds say "
            "little until more runs are recorded") in text, text
