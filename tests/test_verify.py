"""A run directory is verified when it is opened (harmony.load, harmony report): missing or
unreadable tables are named, rebuilt from the raw capture where it is intact (and the notes say
so); a damaged raw capture is one line naming its file; a report never names a figure it did not
write."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

import harmony
from harmony import store
from harmony.analysis.report import write_report
from harmony.cli import main
from harmony.core.errors import RunError
from harmony.simulate import simulate_run


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """A complete simulated single-source run (figures drawn), copied afresh for each test."""
    base = tmp_path_factory.mktemp("verify") / "run"
    simulate_run("poly-balance", "single-source", 4, base, overrides={"duration": "1"})
    return base


@pytest.fixture
def run_dir(simulated, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(simulated, out)
    return out


def _truncate(path, keep=100):
    data = path.read_bytes()
    path.write_bytes(data[:keep])


def test_an_intact_run_loads_as_it_is(run_dir):
    run = harmony.load(run_dir)
    assert run.manifest["tables"] == ["tasks", "events", "markers", "migrations", "runs",
                                      "runqueue", "allocation", "shares"]
    assert not [n for n in run.manifest["notes"] if n.startswith("rebuilt")]
    assert store.table_problems(run_dir, run.manifest["tables"]) == {}


def test_missing_and_unreadable_tables_are_rebuilt_from_the_raw_capture(run_dir):
    before = store.read_table(run_dir / "runs.parquet")
    (run_dir / "allocation.parquet").unlink()
    _truncate(run_dir / "runs.parquet")
    assert set(store.table_problems(run_dir, ["runs", "allocation", "shares"])) == {"runs",
                                                                                   "allocation"}
    run = harmony.load(run_dir)
    assert run.complete and store.table_problems(run_dir, run.manifest["tables"]) == {}
    assert run.runs.equals(before)              # the same table, from the same capture
    [note] = [n for n in run.manifest["notes"] if n.startswith("rebuilt from the raw capture")]
    assert "runs.parquet (was unreadable (ArrowInvalid" in note
    assert "allocation.parquet (was missing)" in note
    [kind] = [n for n in run.manifest["trust_notes"] if n["kind"] == "tables_rebuilt"]
    assert set(kind["tables"]) == {"runs", "allocation"}
    assert "rebuilt from the raw capture" in (run_dir / "report.md").read_text()


def test_a_damaged_raw_capture_is_one_line_naming_the_file_and_the_run_stays(run_dir):
    (run_dir / "shares.parquet").unlink()
    raw = run_dir / "raw" / "synthetic" / "events.parquet"
    _truncate(raw)
    manifest = (run_dir / "manifest.json").read_text()
    with pytest.raises(RunError, match=f"^{raw}: unreadable Parquet"):
        harmony.load(run_dir)
    assert (run_dir / "manifest.json").read_text() == manifest    # still complete, untouched
    r = CliRunner().invoke(main, ["report", str(run_dir)])
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [f"harmony: error: {raw}: unreadable Parquet "
                                             "(ArrowInvalid)"]


def test_the_captures_own_tables_cannot_be_rebuilt(run_dir):
    (run_dir / "tasks.parquet").unlink()
    (run_dir / "runs.parquet").unlink()
    with pytest.raises(RunError) as err:
        harmony.load(run_dir)
    assert str(err.value) == (f"{run_dir}: tasks.parquet missing; runs.parquet missing: the "
                              "capture's own tables (tasks) cannot be rebuilt")


def test_an_imported_run_is_imported_again(run_dir):
    m = json.loads((run_dir / "manifest.json").read_text())
    m["source"] = {"imported": "/somewhere/trace.dat"}
    store.write_json(run_dir / "manifest.json", m)
    (run_dir / "migrations.parquet").unlink()
    with pytest.raises(RunError, match="migrations.parquet missing: import /somewhere/trace.dat "
                                       r"again \(harmony import\) to rebuild them"):
        harmony.load(run_dir)


def test_a_report_names_no_figure_it_did_not_write(run_dir):
    run = harmony.load(run_dir)
    figures = run.manifest["figures"]
    # the experiment's, causes.png and (a run that read its topology) machine.png
    assert len(figures) >= 3 and all((run_dir / f).is_file() for f in figures)
    (run_dir / figures[2]).unlink()
    write_report(run)                           # as it stands: the missing one is said, not shown
    md = (run_dir / "report.md").read_text()
    assert f"]({figures[2]})" not in md and f"Missing: {figures[2]}" in md
    assert all(f"]({f})" in md for f in figures[:2])
    r = CliRunner().invoke(main, ["report", str(run_dir)])  # harmony report draws it again
    assert r.exit_code == 0, r.output
    assert (run_dir / figures[2]).is_file() and "missing:" not in r.output
    assert f"]({figures[2]})" in (run_dir / "report.md").read_text()
