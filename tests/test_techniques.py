"""benchmarks/techniques.py: rows from registered modules become one Markdown table; bad rows
and unknown names are refused; the verdict counts a difference only beyond 2 standard errors."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import techniques  # noqa: E402  (benchmarks/techniques.py)


def _fake_module(tmp_path, monkeypatch, name: str, body: str) -> None:
    (tmp_path / f"techniques_{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(techniques, "TECHNIQUES", [*techniques.TECHNIQUES, name])
    sys.modules.pop(f"techniques_{name}", None)


ROW = (
    "def rows(args):\n"
    "    return [dict(technique='toy', dataset='d' + str(int(args.quick)), acc_on=[0.8, 0.82], acc_off=0.5,\n"
    "                 time_on=1.234, time_off=None, mem_on=100.4, mem_off=99.6, verdict='helps', notes='n1')]\n"
)


def test_table_from_a_registered_module(tmp_path, monkeypatch):
    _fake_module(tmp_path, monkeypatch, "toy", ROW)
    out = tmp_path / "t.md"
    table = techniques.run(
        techniques.parser().parse_args(["--only", "toy", "--quick", "--work", str(tmp_path / "w"), "--out", str(out)])
    )
    lines = table.splitlines()
    assert lines[0].startswith("| technique | dataset | metric | on | off |")
    assert lines[2] == "| toy | d1 | test acc | 81.00 ± 1.41 (n=2) | 50.00 | 1.23 | - | 100 | 100 | helps |"
    assert "- toy / d1: n1" in table
    assert out.read_text() == table


def test_bad_rows_and_names_are_refused(tmp_path, monkeypatch):
    _fake_module(tmp_path, monkeypatch, "bad", "def rows(args):\n    return [dict(technique='x', acc=1)]\n")
    args = techniques.parser().parse_args(["--only", "bad", "--work", str(tmp_path)])
    with pytest.raises(ValueError, match=r"techniques_bad.py returned a row with missing keys \['dataset'"):
        techniques.run(args)
    with pytest.raises(ValueError, match="no such technique"):
        techniques.run(techniques.parser().parse_args(["--only", "nope", "--work", str(tmp_path)]))


def test_verdict_uses_two_standard_errors():
    # diff 0.10 with SE sqrt(0.01²/3 + 0.01²/3) = 0.0082: helps
    assert techniques.verdict([0.80, 0.81, 0.82], [0.70, 0.71, 0.72]).startswith("helps (+10.00 points")
    # diff 0.01 with spreads of 0.05: within noise
    assert techniques.verdict([0.75, 0.80, 0.85], [0.74, 0.79, 0.84]).startswith("no measurable effect (+1.00")
    # lower is better (e.g. seconds): on is slower, so it hurts
    assert techniques.verdict([2.0, 2.1, 2.2], [1.0, 1.1, 1.2], higher_is_better=False, what="s").startswith("hurts")
    assert techniques.verdict(0.9, 0.8) == "+10.00 points (single seed)"
