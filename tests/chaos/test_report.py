"""The drill report (chaos/report.py) from a synthetic run: verdict on the first line, the figures, the
fault table, RTO per fault type, report.json, and a timeline.png that matplotlib really drew."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from chaos.check import check_run
from chaos.record import load_run, write_run
from chaos.report import write_report
from tests.chaos.synth import clean_run


def test_report_of_a_passing_run(tmp_path: Path) -> None:
    _, run = clean_run(tmp_path / "run")
    write_run(run)
    out = write_report(check_run(load_run(tmp_path / "run")), tmp_path / "report")
    md = out["md"].read_text()
    assert md.splitlines()[0].startswith("# PASS: drill `synthetic`, seed 7")
    for words in ("seed **7**", "versions: etcd 3.5.x, sched 0.1.0", "| I1 | at most one effect", "RTO per fault type",
                  "| F2 | 1 | 2.64 | 2.64 | 2.64 |", "stale writes refused by the sink 1", "![timeline](timeline.png)"):
        assert words in md, words
    data = json.loads(out["json"].read_text())
    assert data["verdict"] == "pass" and data["exit_code"] == 0 and data["seed"] == 7
    assert set(data["invariants"]) == {f"I{i}" for i in range(1, 10)}
    png = out["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_report_of_a_failing_run_shows_counterexamples(tmp_path: Path) -> None:
    x, run = clean_run(tmp_path / "run")
    x.effects = [replace(e, accepted=True) for e in x.effects]  # the stale dispatch got through
    run = x.build(tmp_path / "run")
    write_run(run)
    out = write_report(check_run(load_run(tmp_path / "run")), tmp_path / "report")
    md = out["md"].read_text()
    assert md.startswith("# FAIL: drill `synthetic`") and "I4" in md.splitlines()[0]
    assert "### I4 fencing rejects stale planners: 1 violations" in md and "[stale-accepted]" in md
    assert json.loads(out["json"].read_text())["exit_code"] == 1


def test_report_of_an_invalid_run_says_why_first(tmp_path: Path) -> None:
    x, _ = clean_run(tmp_path / "run")
    x.effects = [e for e in x.effects if e.accepted]
    write_run(x.build(tmp_path / "run"))
    md = write_report(check_run(load_run(tmp_path / "run")), tmp_path / "report")["md"].read_text()
    first = md.splitlines()[0]
    assert first.startswith("# INVALID") and "no stale write was refused" in first
    assert "## Why the run is invalid" in md


def test_the_showcase_run_three_planners_three_faults(tmp_path: Path) -> None:
    """The picture in docs/drills.md comes from this run (regenerate it with the report it writes)."""
    from tests.chaos.synth import showcase

    run = showcase(tmp_path / "run")
    write_run(run)
    v = check_run(load_run(tmp_path / "run"))
    assert (v.result, v.invalid) == ("pass", [])
    assert set(v.stats["rto"]) == {"F1", "F2", "F3"} and v.stats["rto"]["F3"]["max_s"] == 0.0
    f1, f2, f3 = v.faults
    assert f1.takeovers == 2 and f2.takeovers == 2 and f2.stale_rejected == 1 and f3.takeovers == 0
    out = write_report(v, tmp_path / "report")
    assert out["png"].stat().st_size > 20_000
