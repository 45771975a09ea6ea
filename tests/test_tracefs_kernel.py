"""The tracefs probe's session: one instance for consecutive captures, each with its own counters."""

import os
import time

import pytest

from harmony.hygiene import HostLock
from harmony.probes.tracefs import PREFIX, TRACEFS, TracefsProbe

from conftest import host_skip, retry_busy


def _host_lock() -> HostLock:
    return retry_busy(lambda: HostLock().acquire(), wait_s=300)  # another run may hold the host


def _switches(seconds: float) -> None:
    """Context switches on this CPU: ~10k sched events per second."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.0001)


def _dropped(meta: dict) -> int:
    return sum(int(s["dropped events"]) + int(s["overrun"]) for s in meta["stats"].values())


def _capture(path, seconds: float, **config) -> TracefsProbe:
    probe = TracefsProbe(path, [0, 1], 1.0, **config)
    probe.start()
    probe.mark(path.name)
    _switches(seconds)
    probe.stop()
    return probe


def test_a_session_reuses_one_instance_and_each_capture_counts_its_own_losses(kernel, tmp_path):
    ours = TRACEFS / "instances" / f"{PREFIX}{os.getpid()}"
    # a 64 KiB buffer per CPU whose drains stop reading 0.3 s after the start: a capture that
    # lasts 1 s overflows it even at a few hundred switches per second (with 256 KiB a slow
    # moment of the host let one CI run through without a loss), one of 0.05 s is drained in time
    config = dict(buffer_kb=64, drain_stall=(0.3, 1.0))
    lock = _host_lock()
    try:
        with TracefsProbe.session():
            a = _capture(tmp_path / "a", 0.05, **config)
            assert ours.is_dir()  # kept for the next capture
            b = _capture(tmp_path / "b", 0.05, **config)
            c = _capture(tmp_path / "c", 1.0, **config)
            d = _capture(tmp_path / "d", 0.05, **config)
            other = _capture(tmp_path / "other", 0.05)  # another buffer size: another instance
        assert not ours.exists()  # removed when the session ends
    finally:
        lock.release()

    assert not a.meta["instance_reused"] and not other.meta["instance_reused"]
    assert b.meta["instance_reused"] and c.meta["instance_reused"] and d.meta["instance_reused"]
    # b follows a lossless capture: the buffer is not reset, its counters are net of a's
    assert not b.meta["instance_reset"] and "stats_at_start" in b.meta
    assert _dropped(c.meta) > 0, c.meta["stats"]  # the kernel did drop events in c...
    assert d.meta["instance_reset"]  # ...so the buffer was reset before d
    for probe in (a, b, d, other):
        assert _dropped(probe.meta) == 0, (probe.out_dir.name, probe.meta["stats"])
    for probe in (a, b, c, d, other):
        cap = TracefsProbe.decode_dir(probe.out_dir)
        # nothing of an earlier capture: only this one's marker, events after its start
        assert list(cap.markers["text"]) == [probe.out_dir.name]
        assert cap.events["ts"].min() >= probe.meta["started_ns"] - 1_000_000
        assert cap.meta["lost_events"] == _dropped(probe.meta)
    assert (tmp_path / "b" / "formats" / "sched" / "sched_switch" / "format").is_file()


def test_a_session_removes_its_instance_on_error(kernel, tmp_path):
    ours = TRACEFS / "instances" / f"{PREFIX}{os.getpid()}"
    lock = _host_lock()
    try:
        with pytest.raises(RuntimeError, match="boom"):
            with TracefsProbe.session():
                p = TracefsProbe(tmp_path / "p", [0, 1], 1.0)
                p.start()
                raise RuntimeError("boom")
        assert p.instance is None  # stopped by the session: its drains no longer hold the instance
        assert not ours.exists()
        p.stop()  # the caller's own cleanup, after: nothing left to do
    finally:
        lock.release()


def test_the_drains_write_whole_pages_while_the_run_lasts(kernel, tmp_path):
    """A read that catches up with the kernel's writer takes the page being written, however
    little it holds: polls that read to the end left, at a few thousand events per second, most
    pages of the file under half full. The drains take whole pages until the stop."""
    import numpy as np
    from harmony.probes.formats import load_header_page

    lock = _host_lock()
    try:
        probe = TracefsProbe(tmp_path / "a", [0, 1], 1.0)
        probe.start()
        end = time.monotonic() + 1.0
        while time.monotonic() < end:   # ~1 k switches a second: a page every few polls
            time.sleep(0.002)
        probe.stop()
    finally:
        lock.release()
    out = tmp_path / "a"
    hp = load_header_page(out / "formats" / "header_page")
    capacity = probe.meta["page_size"] - hp.data_offset
    fills = []
    for raw in sorted(out.glob("cpu*.raw")):
        pages = np.fromfile(raw, np.uint8).reshape(-1, probe.meta["page_size"])[:-1]  # the stop's
        commit = pages[:, hp.commit_offset:hp.commit_offset + 8].copy().view("<u8").ravel()
        fills.extend(((commit & ((1 << 27) - 1)) / capacity).tolist())
    assert len(fills) >= 10, "too few pages to tell"
    assert sum(f < 0.5 for f in fills) <= 0.05 * len(fills), sorted(fills)[:20]
    assert TracefsProbe.decode_dir(out).meta["lost_events"] == 0


def test_the_schedulers_softirq_is_recorded_filtered(kernel, tmp_path):
    """irq:softirq_entry/exit, what tells a periodic balance from a new-idle one
    (harmony.analysis.causes), are recorded for the SCHED vector only: the filter is set in the
    instance, and every entry and exit decoded is vector 7."""
    from harmony.probes.schema import SCHED_SOFTIRQ_VEC

    if not (TRACEFS / "events/irq/softirq_entry").is_dir():
        host_skip("this kernel has no irq:softirq_entry tracepoint")
    lock = _host_lock()
    try:
        probe = _capture(tmp_path / "s", 2.0)
    finally:
        lock.release()
    assert probe.meta["event_filters"] == {"irq:softirq_entry": f"vec == {SCHED_SOFTIRQ_VEC}",
                                           "irq:softirq_exit": f"vec == {SCHED_SOFTIRQ_VEC}"}
    ev = TracefsProbe.decode_dir(tmp_path / "s").events
    soft = ev[ev["event"].astype(str).str.startswith("irq:softirq_")]
    assert len(soft) > 0, "no SCHED softirq in 2 s of switching"
    assert set(soft["prio"]) == {SCHED_SOFTIRQ_VEC}
    for _, per_cpu in soft.groupby("cpu"):
        entries = (per_cpu["event"] == "irq:softirq_entry").sum()
        assert abs(entries - (per_cpu["event"] == "irq:softirq_exit").sum()) <= 1
