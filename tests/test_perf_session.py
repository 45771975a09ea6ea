"""The perf probe's session: the runs of a suite or batch cut out of one ``perf record``.

Kernel tests (root and a working perf; skipped with the reason otherwise) record real runs in a
session and check that each run's perf.data reads as ``perf script`` prints it, holds that run's
stretch only, and that the recording is gone when the session ends, however it ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import retry_busy
from test_perf_probe import _perf_processes_writing, perf_kernel  # noqa: F401  (a fixture)
from test_perf_read import assert_same_events

from harmony.core.osutil import proc_starttime
from harmony.hygiene import HostBusy
from harmony.probes.base import ProbeError
from harmony.probes.perf import SESSION_PREFIX, PerfProbe
from harmony.probes.perf_read import read_perf_data
from harmony.probes.perf_script import run_perf_script


def _session_dirs(pid: int) -> list[Path]:
    return sorted(Path(tempfile.gettempdir()).glob(f"{SESSION_PREFIX}{pid}-*"))


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while proc_starttime(pid) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _record(probe: PerfProbe) -> None:
    """One short 'run': markers around processes forked and reaped (sched events on demand)."""
    probe.start()
    probe.mark("harmony t0")
    subprocess.run(["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do /bin/true; done"], check=True)
    probe.mark("harmony end")
    probe.stop()


@pytest.mark.kernel
@pytest.mark.usefixtures("perf_kernel")
def test_kernel_a_session_cuts_each_run_out_of_one_recording(tmp_path):
    own = PerfProbe(tmp_path / "own", [0, 1], 1.0)     # a run of its own, as `harmony run` records
    _record(own)
    with PerfProbe.session():
        # the third asks for another buffer size (a long run): a recording of its own
        probes = [PerfProbe(tmp_path / f"r{i}", [0, 1], d) for i, d in enumerate((1.0, 1.0, 600.0))]
        for p in probes:
            _record(p)
            assert proc_starttime(p.meta["perf_pid"]) is not None, "ended with the run"
        assert len(_session_dirs(os.getpid())) == 1
    metas = [p.meta for p in probes]
    assert metas[0]["perf_pid"] == metas[1]["perf_pid"] != metas[2]["perf_pid"]
    assert [m["recording_kept"]["segment"] for m in metas] == [1, 2, 1]
    assert all(m["perf_clean_exit"] for m in metas), [m["perf_exit"] for m in metas]
    assert all(_gone(m["perf_pid"]) for m in metas) and not _session_dirs(os.getpid())
    assert not _perf_processes_writing(Path(tempfile.gettempdir()))
    own_cap = PerfProbe.decode_dir(own.out_dir)
    for p in probes:
        # as perf script prints it (the events its parser decodes: not the softirq's)
        read = read_perf_data(p.perf_data)
        parser, _ = run_perf_script("perf", p.perf_data)
        sched = ~read.events["event"].astype(str).str.startswith("irq:")
        assert_same_events(read.events[sched].reset_index(drop=True), parser.events())
        assert read.lost_by_cpu == parser.lost_by_cpu
        ts = read.events["ts"]
        assert len(ts) and ts.min() >= p.meta["start_ns"] and ts.max() <= p.meta["stop_ns"]
        cap = PerfProbe.decode_dir(p.out_dir)
        assert list(cap.markers["text"]) == ["harmony t0", "harmony end"]
        # the same facts as a run's own recording, and which segment of which recording it was
        assert set(cap.meta) == set(own_cap.meta) | {"recording_kept"}
        assert {"perf.data", "perf.log", "meta.json", "markers.jsonl"} <= {
            f.name for f in p.out_dir.iterdir()}


@pytest.mark.kernel
@pytest.mark.usefixtures("perf_kernel")
def test_kernel_a_session_ended_by_an_error_stops_perf(tmp_path):
    probe = PerfProbe(tmp_path / "r", [0, 1], 1.0)
    with pytest.raises(KeyboardInterrupt):
        with PerfProbe.session():
            probe.start()
            pid = int((tmp_path / "r" / "perf.pid").read_text())
            raise KeyboardInterrupt
    assert _gone(pid) and not _session_dirs(os.getpid())
    assert probe.meta["perf_clean_exit"]    # the run was stopped, and its segment written
    with pytest.raises(ProbeError):
        probe.mark("too late")


@pytest.mark.kernel
@pytest.mark.usefixtures("perf_kernel")
def test_kernel_a_killed_controllers_recording_is_reclaimed(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from harmony.probes.perf import PerfProbe\n"
         "with PerfProbe.session():\n"
         "    PerfProbe(Path(sys.argv[1]), [0, 1], 1.0).start()\n"
         "    print('live', flush=True)\n"
         "    time.sleep(120)\n", str(tmp_path / "r")], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"live\n"
        perf = int((tmp_path / "r" / "perf.pid").read_text())
        (left,) = _session_dirs(child.pid)
    finally:
        child.kill()
        child.wait()
    assert _gone(perf), "perf outlived its controller"   # PR_SET_PDEATHSIG
    assert left.is_dir()        # the directory is the next start's to remove
    removed = PerfProbe.reclaim_stale()
    assert any(str(left) in r for r in removed) and not left.exists()


def test_only_the_directories_of_gone_owners_are_reclaimed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    me = os.getpid()
    gone = subprocess.Popen(["true"])
    gone_start = proc_starttime(gone.pid)
    gone.wait()                         # a pid that was a process and is no more
    for name, owner in (("gone", f"{gone.pid} {gone_start}"),
                        ("alive", f"{me} {proc_starttime(me)}"), ("unreadable", None)):
        d = tmp_path / f"{SESSION_PREFIX}{name}"
        d.mkdir()
        if owner:
            (d / "owner.pid").write_text(owner + "\n")
    (tmp_path / "harmony-other").mkdir()
    removed = PerfProbe.reclaim_stale()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["harmony-other", f"{SESSION_PREFIX}alive", f"{SESSION_PREFIX}unreadable"]
    assert len([r for r in removed if "perf session directory" in r]) == 1


@pytest.mark.kernel
@pytest.mark.usefixtures("perf_kernel")
def test_kernel_a_batchs_runs_share_one_recording(tmp_path):
    """`harmony run --repeat 2 --probe perf`: both runs from one perf record, nothing left after."""
    import json

    from click.testing import CliRunner

    from harmony.cli import main

    def attempt():
        r = CliRunner().invoke(main, ["run", "single-source", "--duration", "1", "--repeat", "2",
                                      "-q", "--probe", "perf", "--out", str(tmp_path / "b")])
        if r.exit_code and "is using this host" in r.output:
            shutil.rmtree(tmp_path / "b", ignore_errors=True)
            raise HostBusy(r.output)
        return r

    r = retry_busy(attempt)     # another helper's run may hold the host lock: wait our turn
    assert r.exit_code == 0, r.output
    first, second = (json.loads((tmp_path / "b" / rep / "manifest.json").read_text())
                     for rep in ("rep-01", "rep-02"))
    assert first["status"] == second["status"] == "complete"
    kept = [m["probe_meta"]["recording_kept"] for m in (first, second)]
    assert [k["segment"] for k in kept] == [1, 2]
    assert first["probe_meta"]["perf_pid"] == second["probe_meta"]["perf_pid"]
    assert first["capture"]["n_events"] > 0 and second["capture"]["n_events"] > 0
    assert _gone(first["probe_meta"]["perf_pid"]) and not _session_dirs(os.getpid())
