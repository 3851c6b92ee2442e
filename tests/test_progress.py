"""Progress lines (graphs.infra.progress) and the one rounding / summary rule of asset metadata (assets.reporting)."""

import math
import warnings

import dagster as dg
import pytest

from assets.reporting import rounded, rounded_metadata, summary_line
from graphs.infra.progress import Progress, format_seconds


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_progress_logs_percent_elapsed_and_eta_at_most_every_interval():
    clock, lines = Clock(), []
    p = Progress("sampling", 10, lines.append, unit="minibatches", every=5.0, clock=clock)
    clock.t += 2
    assert not p.advance(2)  # 2 s since the start: too soon for a line
    clock.t += 4
    assert p.advance(2)  # 4 done in 6 s: 6 more take 9 s
    assert lines == ["sampling 4/10 minibatches (40%), 6 s elapsed, ETA 9 s"]
    clock.t += 1
    assert not p.advance(1)
    clock.t += 1
    assert p.advance(5, detail="last")  # the end is always logged, without an ETA; steps past the total are not counted
    assert lines[-1] == "sampling 10/10 minibatches (100%), 8 s elapsed: last"


def test_progress_after_a_resume_rates_only_the_steps_of_this_run():
    clock, lines = Clock(), []
    p = Progress("epoch", 100, lines.append, start=50, every=0, clock=clock)
    clock.t += 10
    p.advance(detail="loss 0.1")  # 1 epoch in 10 s, 49 left
    assert lines == ["epoch 51/100 (51%), 10 s elapsed, ETA 8 min 10 s: loss 0.1"]
    with pytest.raises(ValueError, match="start=5 must lie in 0..total=3"):
        Progress("epoch", 3, lines.append, start=5)


def test_format_seconds_reads_like_a_person_writes_it():
    assert [format_seconds(s) for s in (0.4, 59.6, 61, 3599, 7260)] == [
        "0 s",
        "1 min 0 s",
        "1 min 1 s",
        "59 min 59 s",
        "2 h 1 min",
    ]


def test_rounded_keeps_four_significant_digits_everywhere_and_leaves_other_values():
    assert rounded(8.123456) == 8.123 and rounded(0.995912) == 0.9959 and rounded(1478511.37) == 1479000.0
    assert rounded(1.23456e-5) == 1.235e-05 and rounded(12345) == 12345 and rounded(True) is True
    assert rounded({"a": [0.123456, "x", {"b": 2.0 / 3}]}) == {"a": [0.1235, "x", {"b": 0.6667}]}
    assert math.isnan(rounded(float("nan"))) and rounded(float("inf")) == float("inf")


def test_rounded_metadata_rounds_plain_float_and_json_values_and_keeps_the_rest():
    md = rounded_metadata(
        {
            "seconds": 3.14159265,
            "f": dg.MetadataValue.float(0.123456789),
            "j": dg.MetadataValue.json({"s": [1.23456, 2]}),
            "path": dg.MetadataValue.path("/a/b.1234567"),
            "n": 10,
            "text": "0.123456789",
        }
    )
    assert md["seconds"] == 3.142 and md["f"].value == 0.1235 and md["j"].data == {"s": [1.235, 2]}
    assert md["path"].value == "/a/b.1234567" and md["n"] == 10 and md["text"] == "0.123456789"
    line = summary_line("stage", "cora", md, ("n", "seconds", "missing", "j"))
    assert line == "stage (cora): n 10, seconds 3.142, j {'s': [1.235, 2]}"


def test_the_dagster_notices_are_filtered_by_message_only():
    from pipelines.dagster_cli_hooks import quiet_dagster_notices
    from pipelines.definitions import defs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_dagster_notices()
        keys = dg.AssetSelection.from_coercible(["*"]).resolve(defs.resolve_asset_graph())  # what --select '*' does
        warnings.warn("Parameter `other` of function `X` is currently in beta", dg.BetaWarning, stacklevel=1)
    assert dg.AssetKey("trained_model") in keys
    assert [str(w.message) for w in caught] == ["Parameter `other` of function `X` is currently in beta"]


def test_the_makefile_filter_matches_dagsters_superseded_notice():
    """`make ui` exports PYTHONWARNINGS to hide `dagster dev`'s notice that `dg dev` supersedes it
    (printed before project code loads). Dagster words every such notice alike; the filter, written
    for `dev_command`, is checked on the real notice of `asset_materialize_command` with the name swapped."""
    import re
    from pathlib import Path

    from click.testing import CliRunner
    from dagster._cli.asset import asset_materialize_command

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    (options,) = re.findall(r"^ui: export PYTHONWARNINGS := (.+)$", makefile, flags=re.M)
    assert options == "ignore:Function `dev_command` is superseded"
    as_written = options.replace("dev_command", "asset_materialize_command")
    args = ["-m", "no_such_module_for_this_test", "--select", "x"]
    for filtered in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if filtered:
                warnings._setoption(as_written)  # what Python does with PYTHONWARNINGS at start-up
            CliRunner().invoke(asset_materialize_command, args)  # warns, then fails to load the module
        notices = [w for w in caught if issubclass(w.category, dg.SupersessionWarning)]
        assert len(notices) == (0 if filtered else 1), [str(w.message) for w in caught]


def test_the_pipes_reader_waits_for_the_rest_of_a_line_written_in_two_parts(tmp_path):
    from assets.pipes_messages import whole_lines

    path = tmp_path / "messages"
    path.write_text('{"method": "log", "params": {"message": "epoch 1/')  # the writer is mid-line
    calls = []

    def should_stop():  # called whenever the reader has caught up with the file
        calls.append(len(calls))
        if len(calls) == 1:
            with open(path, "a") as f:
                f.write('14"}}\n{"method": "closed"}\n{"method": "cut')
        return len(calls) > 1

    lines = list(whole_lines(path, should_stop, poll_s=0))
    assert [line.rstrip("\n") for line in lines[:2]] == [
        '{"method": "log", "params": {"message": "epoch 1/14"}}',
        '{"method": "closed"}',
    ]
    assert lines[2] == '{"method": "cut'  # a writer that died mid-line: its rest, once the session ended
    assert len(calls) == 2
