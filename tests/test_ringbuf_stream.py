"""The streamed decode of a trace.dat (harmony.probes.ringbuf_stream): slab after slab, on
threads, the same tables as the decode of the pages held whole, and the same errors."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

from harmony.probes.base import TraceCorrupt

from test_import_export import _stream_to_encode, writer_dat  # noqa: F401 (a fixture)

needs_trace_cmd = pytest.mark.needs_tool("trace-cmd")


def _decode(dat, monkeypatch, how: str):
    """decode_tracedat(dat) with the numpy decoder ("numpy"), the compiled one on the pages held
    whole ("whole") or streamed ("stream": slabs of 3 pages, parts on 3 threads, a string
    table of 4 slots at first, grown as the strings come); asserts which one decoded it."""
    from harmony.core import jit
    from harmony.probes import ringbuf_stream, tracedat_read
    used = []

    def stream(*args, **kwargs):
        used.append(True)
        return ringbuf_stream.decode_stream(*args, **kwargs)

    def refuse(*args, **kwargs):
        raise ringbuf_stream.StreamUnfit("not under test")

    with monkeypatch.context() as m:
        m.setenv("HARMONY_JIT", "0" if how == "numpy" else "1")
        m.setattr(tracedat_read, "decode_stream", stream if how == "stream" else refuse)
        if how == "stream":
            m.setattr(ringbuf_stream, "SLAB_BYTES", 3 * 4096)
            m.setattr(ringbuf_stream, "TABLE_SLOTS", 4)
            m.setattr(jit, "PARALLEL_MIN_ITEMS", 1)
            m.setenv("HARMONY_THREADS", "3")
        cap, _ = tracedat_read.decode_tracedat(dat)
    assert bool(used) == (how == "stream")
    return cap


def assert_same(a, b):
    """The same events (categories may be numbered differently), markers and meta."""
    assert list(a.events.columns) == list(b.events.columns) and len(a.events) == len(b.events)
    for col in a.events.columns:
        assert (a.events[col].astype(object).to_numpy()
                == b.events[col].astype(object).to_numpy()).all(), col
        assert a.events[col].dtype.kind == b.events[col].dtype.kind, col
    pd.testing.assert_frame_equal(a.markers, b.markers)
    ma, mb = dict(a.meta), dict(b.meta)
    ma.pop("decoder"), mb.pop("decoder")
    assert ma == mb


def _simulated(tmp_path, ncpus: int, stretch: int):
    from harmony.probes.encode import write_recording
    from harmony.probes.tracedat_write import write_tracedat
    events, markers = _stream_to_encode(ncpus, 20_000, stretch)
    write_recording(events, markers, {"cpus": list(range(ncpus)), "lost_events": 7,
                                      "lost_by_cpu": {"2": 7}, "clock": "mono"},
                    tmp_path / "rec")
    return write_tracedat(tmp_path / "rec", tmp_path / "sim.dat")


@pytest.mark.parametrize("ncpus,stretch", [(4, 1), (64, 10_000)])
def test_a_streamed_decode_gives_the_tables_of_the_whole_decode(tmp_path, monkeypatch, ncpus,
                                                                 stretch):
    """A trace of many events on 4 or 64 CPUs (time extends, markers, a marker too long for a
    page, events the decoder has no rule for): streamed in slabs of 3 pages on 3 threads, the
    same events in the same order, the same markers and meta as decoded whole, compiled or not."""
    dat = _simulated(tmp_path, ncpus, stretch)
    streamed = _decode(dat, monkeypatch, "stream")
    assert len(streamed.events) > 20_000 and len(streamed.markers) == 3
    assert streamed.meta["decoder"] == "compiled" and streamed.meta["lost_events"] == 7
    assert_same(streamed, _decode(dat, monkeypatch, "whole"))
    assert_same(streamed, _decode(dat, monkeypatch, "numpy"))


@needs_trace_cmd
def test_a_compressed_trace_streams_chunk_by_chunk(tmp_path, monkeypatch):
    """Version 7 compressed (zstd: what trace-cmd writes): each slab decompressed from its
    chunks into the part's buffer, the same capture as its version 6 and as the pages
    decompressed whole."""
    compression = "zstd"
    dat = _simulated(tmp_path, 4, 1)
    v7 = tmp_path / f"v7-{compression}.dat"
    p = subprocess.run([shutil.which("trace-cmd"), "convert", "-i", str(dat), "-o", str(v7),
                        "--file-version", "7", "--compression", compression],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    streamed = _decode(v7, monkeypatch, "stream")
    assert streamed.meta["compression"] == compression
    assert_same(streamed, _decode(v7, monkeypatch, "whole"))
    plain = _decode(dat, monkeypatch, "stream")
    for k in ("file_version", "compression"):
        streamed.meta.pop(k), plain.meta.pop(k)
    assert_same(streamed, plain)


def test_lost_events_and_statistics_stream_as_they_decode_whole(writer_dat, monkeypatch):  # noqa: F811
    """The hand-built capture: pages after lost events (counted, not stored) and CPUSTAT."""
    _, dat = writer_dat
    streamed = _decode(dat, monkeypatch, "stream")
    assert streamed.meta["lost_by_cpu"] == {0: 10, 1: 5}
    assert_same(streamed, _decode(dat, monkeypatch, "whole"))


def test_a_corrupt_page_in_a_late_slab_is_named_as_the_whole_decode_names_it(tmp_path,
                                                                              monkeypatch):
    """A page whose commit size runs past it, on the last CPU's last slab (another part's): the
    streamed decode raises the same TraceCorrupt, naming the file, CPU and page."""
    from harmony.probes.tracedat_read import read_tracedat
    dat = _simulated(tmp_path, 4, 1)
    buf = read_tracedat(dat).buffers[0]
    cpu = max(buf.cpus)
    off, size = buf.cpus[cpu]
    page = size // 4096 - 1
    data = bytearray(dat.read_bytes())
    data[off + page * 4096 + 8:off + page * 4096 + 12] = (4090).to_bytes(4, "little")
    dat.write_bytes(bytes(data))
    errors = []
    for how in ("stream", "whole"):
        with pytest.raises(TraceCorrupt) as e:
            _decode(dat, monkeypatch, how)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    assert f"CPU {cpu} data" in errors[0] and f"page {page} " in errors[0]
    assert str(dat) in errors[0]


@pytest.mark.parametrize("events", ["none", "one-cpu"])
def test_a_trace_of_markers_alone_or_one_cpu_streams_as_it_decodes_whole(tmp_path, monkeypatch,
                                                                          events):
    """No event at all (markers only), or every event on one CPU (one part's rows, its own
    runs): the same tables either way."""
    from harmony.probes.encode import write_recording
    from harmony.probes.tracedat_write import write_tracedat
    ev, markers = _stream_to_encode(4, 20_000, 1)
    ev = ev.iloc[:0] if events == "none" else ev[ev["cpu"] == 2].reset_index(drop=True)
    write_recording(ev, markers, {"cpus": [0, 1, 2, 3], "clock": "mono"}, tmp_path / "rec")
    dat = write_tracedat(tmp_path / "rec", tmp_path / "m.dat")
    streamed = _decode(dat, monkeypatch, "stream")
    assert len(streamed.events) == len(ev) and len(streamed.markers) == 3
    assert_same(streamed, _decode(dat, monkeypatch, "whole"))


def test_slabs_end_where_the_pages_may_be_cut():
    """Slabs hold whole cuts (a compressed trace's chunks), as many as fit, at least one."""
    from harmony.probes.ringbuf_stream import PageSpace, slabs
    cuts = np.array([0, 10, 20, 25, 40, 41, 100])
    space = PageSpace(4096, np.zeros(100, np.int64), np.zeros(100, np.int64),
                      np.arange(100), ["f"], cuts)
    assert slabs(space, 20 * 4096) == [(0, 20), (20, 40), (40, 41), (41, 100)]
    assert slabs(space, 4096) == [(0, 10), (10, 20), (20, 25), (25, 40), (40, 41), (41, 100)]
    got = slabs(space, 1 << 30)
    assert got == [(0, 100)]
