"""The pyperf probe: the sched tracepoints through the kernel's python-perf binding.

Hermetic tests build the files the probe writes (records as the kernel writes them into a perf
ring, the formats, meta.json with its clock ties) and decode them; they check the clock tie's
arithmetic, the binding's search and what doctor and ``harmony run`` say when it cannot load.
Kernel tests (root, the binding loadable; skipped with the reason otherwise) record a short
single-source run with ``--probe pyperf --crosscheck tracefs`` and hold pyperf's events against
the tracefs probe's of the same run (the cross-check, the method of test_perf_probe.py), check
that the kernel's own counts account for every sample, that a storm's losses are counted, and
that nothing is left behind.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from harmony.core.errors import ProbeError, TraceCorrupt
from harmony.probes import perf_binding
from harmony.probes.pyperf import PyperfProbe
from harmony.probes.pyperf_clock import offsets, to_mono
from harmony.probes.pyperf_decode import lost_cpu_from_end, sample_layout

from conftest import host_skip, retry_busy
from test_ringbuf import (FORMATS_WAKING, HEADER_EVENT, HEADER_PAGE, encode, format_text,
                          parsed_formats)

SAMPLE_TYPE = (1 << 2) | (1 << 7) | (1 << 10)        # TIME | CPU | RAW, as the probe asks


# ----------------------------------------------------------------------- hermetic: the records

def sample(payload: bytes, perf_ts: int, cpu: int) -> bytes:
    """A PERF_RECORD_SAMPLE of TIME, CPU and RAW, as the kernel writes it into a ring (the RAW
    size padded so that the record is a whole number of 8-byte words)."""
    raw = payload + bytes(-(4 + len(payload)) % 8)
    body = struct.pack("<QIII", perf_ts, cpu, 0, len(raw)) + raw
    return struct.pack("<IHH", 9, 0, 8 + len(body)) + body


def lost(n: int, perf_ts: int, cpu: int) -> bytes:
    """A PERF_RECORD_LOST with its sample_id trailer (TIME, CPU)."""
    body = struct.pack("<QQQII", 77, n, perf_ts, cpu, 0)
    return struct.pack("<IHH", 2, 0, 8 + len(body)) + body


def tie(offset: int, perf_ns: int, bound: int = 4000) -> dict:
    return {"one_clock": True, "offset_ns": offset, "bound_ns": bound, "perf_ns": perf_ns,
            "per_cpu": {"0": {"offset_ns": offset, "bound_ns": bound, "faults": 16},
                        "1": {"offset_ns": offset, "bound_ns": bound, "faults": 16}},
            "faults": 32}


def write_capture(d: Path, chunks: list[bytes], meta: dict | None = None,
                  table=FORMATS_WAKING) -> Path:
    """A pyperf recording directory: formats/, records.raw (the chunks as the drain wrote
    them), meta.json."""
    (d / "formats").mkdir(parents=True, exist_ok=True)
    (d / "formats/header_page").write_text(HEADER_PAGE)
    (d / "formats/header_event").write_text(HEADER_EVENT)
    for key, spec in table.items():
        (d / "formats" / key).mkdir(parents=True, exist_ok=True)
        (d / "formats" / key / "format").write_text(format_text(spec))
    (d / "records.raw").write_bytes(b"".join(chunks))
    base = {"probe": "pyperf", "sample_type": SAMPLE_TYPE, "cpus": [0, 1],
            "events_enabled": ["sched_switch", "sched_migrate_task", "sched_wakeup"],
            "clock_tie": {"start": tie(1_000, 10_000_000_000),
                          "stop": tie(1_100, 11_000_000_000)},
            "kernel_counts": {"hits": 9, "lost": 3}}
    (d / "meta.json").write_text(json.dumps({**base, **(meta or {})}))
    return d


def known_chunks():
    """Two rings' records, drained in three chunks (CPU 0, CPU 1, CPU 0 again), a LOST record
    on CPU 1; and the rows they decode to (ts on CLOCK_MONOTONIC, cpu, event, pid, comm,
    prev_pid)."""
    f = parsed_formats(FORMATS_WAKING)
    sw, mg, wk = (f[f"sched/{e}"] for e in ("sched_switch", "sched_migrate_task",
                                              "sched_wakeup"))
    t0 = 10_000_000_000

    def mono(t):      # the ties: 1000 ns at t0, 1100 ns a second later, interpolated
        return t - 1000 - round((t - t0) * 100 / 1e9)

    a = [sample(encode(sw, dict(common_pid=10, prev_comm="a", prev_pid=10, prev_prio=120,
                                prev_state=1, next_comm="b", next_pid=11, next_prio=120)),
                t0 + 500_000_000, 0),
         sample(encode(wk, dict(common_pid=11, comm="c", pid=12, prio=120, target_cpu=1)),
                t0 + 600_000_000, 0)]
    b = [sample(encode(mg, dict(common_pid=0, comm="c", pid=12, prio=120, orig_cpu=0,
                                dest_cpu=1)), t0 + 550_000_000, 1),
         lost(3, t0 + 560_000_000, 1),
         sample(encode(sw, dict(common_pid=0, prev_comm="swapper/1", prev_pid=0,
                                prev_prio=120, prev_state=0, next_comm="c", next_pid=12,
                                next_prio=120)), t0 + 600_000_000, 1)]
    c = [sample(encode(sw, dict(common_pid=11, prev_comm="b", prev_pid=11, prev_prio=120,
                                prev_state=0, next_comm="a", next_pid=10, next_prio=120)),
                t0 + 900_000_000, 0)]
    rows = [(mono(t0 + 500_000_000), 0, "sched_switch", 11, "b", 10),
            (mono(t0 + 550_000_000), 1, "sched_migrate_task", 12, "c", -1),
            (mono(t0 + 600_000_000), 0, "sched_wakeup", 12, "c", -1),   # one instant: by CPU
            (mono(t0 + 600_000_000), 1, "sched_switch", 12, "c", 0),
            (mono(t0 + 900_000_000), 0, "sched_switch", 10, "a", 11)]
    return [b"".join(a), b"".join(b), b"".join(c)], rows


def test_decode_known_records(tmp_path):
    chunks, rows = known_chunks()
    cap = PyperfProbe.decode_dir(write_capture(tmp_path / "p", chunks))
    ev = cap.events
    got = list(zip(ev["ts"].tolist(), ev["cpu"].tolist(), ev["event"].astype(str),
                   ev["pid"].tolist(), ev["comm"].astype(str), ev["prev_pid"].tolist()))
    assert got == rows
    assert ev.loc[0, "prev_state"] == 1 and ev.loc[1, "orig_cpu"] == 0 \
        and ev.loc[1, "target_cpu"] == 1
    m = cap.meta
    assert (m["probe"], m["clock"], m["n_events"], m["n_samples"]) == ("pyperf", "mono", 5, 5)
    # the events' own counts (kernel_counts) are the run's losses; the LOST records by CPU
    assert m["lost_events"] == 3 and m["lost_by_cpu"] == {1: 3}
    assert m["records"] == {"LOST": 1, "SAMPLE": 5}
    # 9 hits counted, 5 written, 3 lost: 1 neither (a blind context's), said in the notes
    assert m["unwritten_hits"] == 1
    assert any("1 hits were neither written nor counted lost" in n for n in m["notes"])
    assert any(n.startswith("perf clock tied to CLOCK_MONOTONIC") and "+100 ns drift" in n
               for n in m["notes"]), m["notes"]


def test_lost_records_and_counts_that_differ_are_both_said(tmp_path):
    chunks, _ = known_chunks()
    d = write_capture(tmp_path / "p", chunks, {"kernel_counts": {"hits": 20, "lost": 7}})
    m = PyperfProbe.decode_dir(d).meta
    assert m["lost_events"] == 7
    assert any("own counts say 7 samples lost, the rings' PERF_RECORD_LOST 3" in n
               for n in m["notes"])
    # a kernel that does not count them (before 6.0): the LOST records are the losses
    d = write_capture(tmp_path / "q", chunks, {"kernel_counts": {"hits": 20, "lost": None}})
    m = PyperfProbe.decode_dir(d).meta
    assert m["lost_events"] == 3 and any("before Linux 6.0" in n for n in m["notes"])


def test_an_empty_recording_decodes_to_no_events(tmp_path):
    cap = PyperfProbe.decode_dir(write_capture(tmp_path / "p", [],
                                               {"kernel_counts": {"hits": 0, "lost": 0}}))
    assert len(cap.events) == 0 and cap.meta["lost_events"] == 0


@pytest.mark.parametrize("damage,why", [
    ("cut", "not a whole number of records"),
    ("size", "truncated or corrupt record at file offset"),
    ("payload", "its payload runs past the record"),
    ("no_tie", "no clock tie"),
])
def test_corrupt_recording_is_one_line_naming_the_file(tmp_path, damage, why):
    chunks, _ = known_chunks()
    data = b"".join(chunks)
    meta = None
    if damage == "cut":
        data = data[:-4]
    elif damage == "size":        # the second record's size made to run past the file
        first = struct.unpack_from("<H", data, 6)[0]
        data = data[:first + 6] + struct.pack("<H", 0xfff8) + data[first + 8:]
    elif damage == "payload":     # the first sample's RAW size beyond its record
        data = data[:24] + struct.pack("<I", 4096) + data[28:]
    else:
        meta = {"clock_tie": {}}
    d = write_capture(tmp_path / "p", [data], meta)
    with pytest.raises(TraceCorrupt, match=why) as exc:
        PyperfProbe.decode_dir(d)
    text = str(exc.value)
    assert "\n" not in text
    assert str(d / ("meta.json" if damage == "no_tie" else "records.raw")) in text


def test_sample_layout_follows_the_kernels_order():
    assert sample_layout(SAMPLE_TYPE) == {"time": 8, "cpu": 16, "raw_size": 24}
    with_more = SAMPLE_TYPE | (1 << 16) | (1 << 1) | (1 << 8)   # IDENTIFIER, TID, PERIOD
    assert sample_layout(with_more) == {"time": 24, "cpu": 32, "raw_size": 48}
    with pytest.raises(ValueError, match="lacks TIME"):
        sample_layout(SAMPLE_TYPE & ~(1 << 2))
    assert lost_cpu_from_end(SAMPLE_TYPE) == 8 and lost_cpu_from_end(SAMPLE_TYPE | 1 << 16) == 16


# --------------------------------------------------------------------- hermetic: the clock tie

def test_offset_is_the_tightest_bound_and_one_clock_when_the_cpus_agree():
    # (cpu, T, t1, t2): each fault stamped 300-900 ns after t1, the offset 5000 ns
    faults = [(0, 5000 + 1300, 1000, 7000), (0, 5000 + 2900, 2000, 8000),
              (1, 5000 + 3500, 3000, 9000), (1, 5000 + 4800, 4000, 10000)]
    t = offsets(faults)
    assert t["one_clock"] and t["offset_ns"] == 5300       # min(T - t1): 300 ns above
    assert t["offset_ns"] - t["bound_ns"] <= 5000 <= t["offset_ns"]
    assert t["per_cpu"][0]["faults"] == 2 and t["faults"] == 4
    # two CPUs whose intervals share no point: each its own offset
    apart = faults[:2] + [(c, T + 50_000, t1, t2) for c, T, t1, t2 in faults[2:]]
    t = offsets(apart)
    assert not t["one_clock"] and t["offset_ns"] is None
    assert (t["per_cpu"][0]["offset_ns"], t["per_cpu"][1]["offset_ns"]) == (5300, 55_500)
    with pytest.raises(ProbeError, match="no page fault"):
        offsets([])


def test_to_mono_interpolates_the_drift_per_cpu():
    a, b = tie(1000, 0), tie(2000, 1_000_000)
    ts = np.array([0, 500_000, 1_000_000, 2_000_000])
    assert to_mono(ts, np.zeros(4), a, b).tolist() == [-1000, 498_500, 998_000, 1_997_000]
    assert to_mono(ts, np.zeros(4), a, None).tolist() == (ts - 1000).tolist()
    per_cpu = {"one_clock": False, "offset_ns": None, "perf_ns": 0,
               "per_cpu": {"0": {"offset_ns": 10}, "1": {"offset_ns": 20}}}
    assert to_mono(np.array([100, 100]), np.array([0, 1]), per_cpu, None).tolist() == [90, 80]


# -------------------------------------------------------------------- hermetic: the binding

@pytest.fixture
def binding_at(monkeypatch):
    """Point HARMONY_PYTHON_PERF at a path (the search's answer is then that file's)."""
    def point(path):
        monkeypatch.setenv(perf_binding.ENV_PATH, str(path))
        PyperfProbe._available_ok_until = 0.0
        return perf_binding.find(refresh=True)
    return point


def _facts() -> dict:
    return {"sched_tracepoints": {"present": ["sched_switch", "sched_migrate_task",
                                              "sched_wakeup"]}}


def test_doctor_says_why_the_binding_is_not_there(tmp_path, binding_at):
    b = binding_at(tmp_path / "nothing.so")
    c = PyperfProbe.doctor_check(_facts())
    assert c["status"] == "missing" and not b.loaded
    assert c["detail"].startswith("no python-perf binding installed")
    other = "cpython-399-x86_64-linux-gnu" if perf_binding.python_abi() != \
        "cpython-399-x86_64-linux-gnu" else "cpython-398-x86_64-linux-gnu"
    f = tmp_path / f"perf.{other}.so"
    f.write_bytes(b"\x7fELF")
    binding_at(f)
    c = PyperfProbe.doctor_check(_facts())
    assert c["status"] == "warn" and "another Python ABI" in c["detail"] and other in c["detail"]
    assert perf_binding.python_abi() in c["detail"]
    f = tmp_path / f"perf.{perf_binding.python_abi()}.so"
    f.write_bytes(b"not an ELF file")
    binding_at(f)
    c = PyperfProbe.doctor_check(_facts())
    assert c["status"] == "warn" and "import failed" in c["detail"] and str(f) in c["detail"]
    assert "\n" not in c["detail"] and c["can_record_sched"] is False
    assert PyperfProbe.cannot_record({**_facts(), "pyperf": c}).startswith("pyperf: ")


def test_binding_found_from_the_package_file_list(tmp_path, monkeypatch):
    monkeypatch.delenv(perf_binding.ENV_PATH, raising=False)
    so = tmp_path / "lib" / f"perf.{perf_binding.python_abi()}.so"
    so.parent.mkdir()
    so.write_bytes(b"x")
    info = tmp_path / "info"
    info.mkdir()
    (info / "linux-perf-5.10.list").write_text(f"/.\n/usr/bin/perf\n{so}\n{so.parent}\n")
    (info / "other.list").write_text(f"{tmp_path / 'elsewhere' / 'perf.so'}\n")
    assert perf_binding.candidates(info, dirs=()) == [(str(so), "linux-perf-5.10")]
    assert perf_binding.abi_tag(str(so)) == perf_binding.python_abi()
    assert perf_binding.abi_tag("/x/perf.so") is None


def test_run_without_the_binding_is_refused_in_one_line(tmp_path, binding_at):
    from click.testing import CliRunner

    from harmony.cli import main

    binding_at(tmp_path / "none.so")
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["run", "single-source", "--duration", "1", "--probe", "pyperf",
                                  "--out", str(out)])
    assert r.exit_code == 1, r.output
    [line] = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert line.startswith("harmony: error: probe pyperf cannot record here: python-perf "
                           "binding: no python-perf binding installed"), line
    assert not out.exists()


# ----------------------------------------------------------------------------- real kernel

@pytest.fixture(scope="session")
def pyperf_kernel(kernel):
    ok, why = PyperfProbe.available()
    if not ok:
        host_skip(why)
    return kernel


def _left_in_process() -> tuple[list, list]:
    """This process's perf rings and perf event descriptors (the probe's closing done)."""
    from harmony.probes.pyperf_ring import perf_mappings, wait_closed

    wait_closed()
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "perf_event" in os.readlink(f"/proc/self/fd/{fd}"):
                fds.append(int(fd))
        except OSError:
            pass
    return perf_mappings(), fds


@pytest.fixture(scope="module")
def crosscheck_run(pyperf_kernel, tmp_path_factory):
    """One single-source <5,0> run (2 s: the balancer moves the odd task back and forth) with
    the pyperf probe, recorded by tracefs too, through the library entry point `harmony run`
    uses."""
    from harmony.experiments import get_experiment
    from harmony.hygiene import HostBusy
    from harmony.run import execute

    out = tmp_path_factory.mktemp("pyperf") / "run"
    exp = get_experiment("single-source")
    params = exp.resolve({"layout": "5,0", "duration": "2"}, [0, 1])

    def attempt():
        try:
            return execute(exp, params, [0, 1], out, "pyperf", quiet=True, crosscheck="tracefs")
        except HostBusy:
            import shutil
            shutil.rmtree(out, ignore_errors=True)
            raise

    return retry_busy(attempt)


@pytest.mark.kernel
def test_kernel_pyperf_agrees_with_tracefs_on_the_same_run(crosscheck_run):
    import harmony

    run = harmony.load(crosscheck_run.path)
    m = run.manifest
    assert m["probe"] == "pyperf" and m["capture"]["clock"] == "mono"
    assert {"harmony t0", "harmony released", "harmony end"} <= set(run.markers["text"])
    assert m["t0_ns"] < m["released_ns"] < m["end_ns"]
    assert any(n.startswith("perf clock tied to CLOCK_MONOTONIC") for n in m["notes"])
    assert m["capture"]["clock_tie"]["start"]["faults"] > 0
    # the tracefs probe's tables of the same run have the same columns and dtypes
    from harmony.probes.tracefs import TracefsProbe
    other = TracefsProbe.decode_dir(crosscheck_run.path / "raw" / "tracefs").events
    assert list(run.events.columns) == list(other.columns)
    assert run.events.dtypes.astype(str).to_dict() == other.dtypes.astype(str).to_dict()
    # the kernel's own counts account for every sample: none written beyond its hits
    cap = m["capture"]
    assert cap["unwritten_hits"] is not None and cap["unwritten_hits"] >= 0, cap["kernel_counts"]
    x = json.loads((crosscheck_run.path / "crosscheck.json").read_text())
    assert x["probes"] == ["pyperf", "tracefs"]
    assert x["migrations"]["tracefs"] >= 1 and x["runs"]["tracefs"] >= 1
    if x["lost_events"]["pyperf"] or x["lost_events"]["tracefs"]:
        host_skip(f"the cross-checked run lost events {x['lost_events']}: the probes' agreement "
                  "is not judged")
    # event for event, within the blind spots perf_event has here (see probes/perf.py): every
    # run interval matched; every migration pyperf holds tracefs holds; every one pyperf lacks
    # fired in a context pyperf records nothing in, and its own stream proves the move
    s = x["runs"]
    assert s["only_pyperf"] == 0 and s["only_tracefs"] == 0, s["examples"]
    s = x["migrations"]
    assert s["only_pyperf"] == 0, s["examples"]
    assert s["unmatched_in_blind_context"] == s["only_tracefs"], s["examples"]
    if s["only_tracefs"]:
        assert x["unrecorded_migrations"]["pyperf"]["n"] >= 1, x["unrecorded_migrations"]
    assert x["verdict"] == ("agree" if s["only_tracefs"] == 0 else "disagree (blind contexts)")
    assert x["run_anomalies"]["pyperf"] == x["run_anomalies"]["tracefs"]


@pytest.mark.kernel
def test_kernel_probe_leaves_nothing_and_reuses_its_events_in_a_session(pyperf_kernel,
                                                                          tmp_path):
    probe = PyperfProbe(tmp_path / "p", [0, 1], 1.0)
    with pytest.raises(ProbeError):
        probe.mark("too early")
    assert probe.helper_tids() == []         # its drain is one of the caller's threads
    with PyperfProbe.session():
        for k in range(2):
            probe = PyperfProbe(tmp_path / f"p{k}", [0, 1], 1.0)
            probe.start()
            try:
                probe.mark("harmony t0")
                subprocess.run([sys.executable, "-c", "pass"], check=True)   # a fork, an exit
            finally:
                probe.stop()
            probe.stop()                     # idempotent
            cap = PyperfProbe.decode_dir(tmp_path / f"p{k}")
            assert list(cap.markers["text"]) == ["harmony t0"]
            assert cap.meta.get("events_reused", 0) == k
            ev = cap.events["event"].astype(str)
            assert (ev == "sched_process_fork").any() and (ev == "sched_process_exit").any()
            assert cap.meta["unwritten_hits"] >= 0
        assert _left_in_process()[0], "the session's rings were closed before its end"
    assert _left_in_process() == ([], [])


@pytest.mark.kernel
def test_kernel_a_full_ring_loses_samples_and_the_run_says_so(pyperf_kernel, tmp_path,
                                                              monkeypatch):
    """A one-page ring whose drain stops reading for 0.6 s: the kernel loses samples, writes
    PERF_RECORD_LOST records once there is room, and counts them per event too."""
    monkeypatch.setenv("HARMONY_PYPERF_PAGES", "1")
    monkeypatch.setenv("HARMONY_PYPERF_DRAIN_STALL", "0:0.6")
    probe = PyperfProbe(tmp_path / "p", [0, 1], 1.0)
    probe.start()
    try:
        storm = subprocess.Popen([sys.executable, "-c", PINGPONG, "0.8"])
        storm.wait(timeout=30)
        time.sleep(0.1)             # the drain reads again: the kernel writes its LOST records
    finally:
        probe.stop()
    cap = PyperfProbe.decode_dir(tmp_path / "p")
    m = cap.meta
    assert m["lost_events"] > 0, m["kernel_counts"]
    assert 0 < sum(m["lost_by_cpu"].values()) <= m["lost_events"]
    assert set(m["lost_by_cpu"]) <= {0, 1}
    assert m["kernel_counts"]["hits"] >= m["n_samples"] + m["lost_events"]
    assert any("sched events lost (perf ring buffer full)" in n for n in m["notes"])
    assert _left_in_process() == ([], [])


#: two processes passing a byte back and forth through pipes for argv[1] seconds
PINGPONG = """
import os, sys, time
a, b = os.pipe(), os.pipe()
end = time.monotonic() + float(sys.argv[1])
if os.fork() == 0:
    while os.read(a[0], 1) != b"q":
        os.write(b[1], b"x")
    os._exit(0)
while time.monotonic() < end:
    os.write(a[1], b"x")
    os.read(b[0], 1)
os.write(a[1], b"q")
os.wait()
"""
