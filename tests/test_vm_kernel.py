"""Kernels under test for real: the guest agent capturing on this host without pandas, a Debian
6.1 kernel booted at P = 4 running single-source end to end, QEMU killed mid-run, and what
`trace-cmd record` and `perf record` wrote in such a guest (kept in tests/data) imported here.

The VM tests need QEMU, virtme-ng and busybox (install.sh installs them; CI runs it) and fetch
the kernel from Debian into the cache once per machine; they skip with the reason only where
those are missing (and fail in CI)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_run import HARMONY, cli
from conftest import pids_with_comm, until

import harmony
from harmony import store
from harmony.cli.screens import run_screen

VM_TOOLS = ("qemu-system-x86_64", "vng", "busybox")


def test_the_guest_agent_captures_here_without_pandas(kernel, tmp_path):
    """The agent's capture (the same harmony.run.capture, its tables as JSON rows) run on this
    host: no pandas, numpy, numba or matplotlib is loaded, and the host lands and analyses it."""
    from harmony.core.osutil import online_cpus
    from harmony.experiments import get_experiment
    from harmony.pipeline import analyse
    from harmony.run import land
    from harmony.vm.guest import PlannedRun, write_job

    exp = get_experiment("single-source")
    cpus = online_cpus()
    params = exp.resolve({"duration": "1", "layout": ",".join(["2"] + ["0"] * (len(cpus) - 1))},
                         cpus)
    write_job(tmp_path / "job.json", [PlannedRun.of(exp, params, cpus, tmp_path / "r",
                                                    "tracefs", 0)])
    code = ("import sys, json; from pathlib import Path; from harmony.vm import guest; "
            "runs = guest.read_job(Path(sys.argv[1])); facts = guest.guest_facts(); "
            "failed = guest.run_job(runs, facts); "
            "print(json.dumps({'failed': failed, 'loaded': sorted(m for m in ('pandas', 'numba', "
            "'matplotlib', 'pyarrow', 'numpy') if m in sys.modules)}))")
    deadline = time.monotonic() + 300
    while True:
        p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "job.json")],
                           capture_output=True, text=True, timeout=120)
        if "another Harmony run" not in p.stdout or time.monotonic() > deadline:
            break
        time.sleep(2)
    events = [json.loads(line.removeprefix("@harmony ")) for line in p.stdout.splitlines()
              if line.startswith("@harmony ")]
    assert [e["event"] for e in events] == ["start", "measuring", "measured", "done"], p.stdout
    assert json.loads(p.stdout.splitlines()[-1]) == {"failed": 0, "loaded": []}
    assert {"tasks", "kernel_samples", "kernel_counters"} <= set(land(tmp_path / "r"))
    run = analyse(tmp_path / "r", figures=False)
    assert run.complete and len(run.tasks) == 2
    assert run.manifest["kernel_counter_agreement"]["disagreeing"] == 0


def _qemu_pids() -> set[int]:
    return set(pids_with_comm("qemu-system"))


def _a_debian_6_1_run_at_4_vcpus(m: dict) -> None:
    """A single-source run's manifest (default layout, 1 s) made in a debian:6.1 guest at 4
    vCPUs: the guest's kernel under test, the host's own facts, the VM, both clocks, and the
    kernel's counts agreeing for every task."""
    under = m["under_test"]
    assert under["kernel"].startswith("6.1.") and under["scheduler"] == "CFS"
    assert under["ncpus"] == 4 and m["cpus"] == [0, 1, 2, 3]
    assert m["host"]["kernel"] == os.uname().release            # the host's own facts
    vm = m["vm"]
    assert vm["kernel"]["spec"] == "debian:6.1" and vm["vcpus"] == 4
    assert vm["kernel"]["source"]["package"].startswith("linux-image-6.1.0-")
    assert vm["accelerator"] in ("kvm", "tcg") and vm["accelerator_why"]
    assert vm["qemu"] and vm["virtme_ng"] and vm["boot_s"] > 0
    assert len(vm["vcpu_wait_frac"]) == 4 and all(0 <= f <= 1 for f in vm["vcpu_wait_frac"])
    # the window on both clocks: the guest's CLOCK_MONOTONIC from the agent's lines
    assert vm["window_host_s"] >= 1 and vm["window_guest_s"] >= 1 and vm["guest_clock_rate"] > 0
    kc = m["kernel_counter_agreement"]
    assert kc["disagreeing"] == 0 and kc["tasks"] == 8, kc
    # the guest's tick rate (the predictions' jiffy) is its kernel's, as the package's own config
    # beside its image on the host says: the guest's /boot is the host's
    k = vm["kernel"]
    config = (Path(k["image"]).parent / f"config-{k['release']}").read_text()
    assert under["hz"] == int(re.search(r"^CONFIG_HZ=(\d+)$", config, re.M).group(1))


@pytest.mark.needs_tool(*VM_TOOLS)
def test_rounds_in_one_debian_6_1_boot_and_a_job_that_breaks_the_agent(kernel, tmp_path):
    """Two flushes of the VM runner (what `harmony run --kernel` runs) in one boot of a Debian
    6.1 kernel at P = 4 (whose virtio_console is a module: the agent loads it to open its input
    port), each analysed before the next is planned, as a run that goes on until its answer is
    decided does; each a single-source run end to end, its manifest the guest's kernel, the VM
    and both clocks, its screen the guest's kernel; then a job the agent cannot run (an unknown
    probe, outside a run) makes it fail, and its own error is in the host's one-line error. One
    boot for all of it (~40-60 s under TCG here; the CLI's own VM path runs to its end in the
    6.12 tests of test_schedstat.py and test_server_kernel.py)."""
    from harmony import doctor
    from harmony.core.errors import VmError
    from harmony.experiments import get_experiment
    from harmony.hygiene import HostBusy
    from harmony.vm import kernels
    from harmony.vm.runner import VmRunner

    before = _qemu_pids()
    exp = get_experiment("single-source")
    cpus = [0, 1, 2, 3]
    params = exp.resolve({"duration": "1"}, cpus)
    # the host's facts as `harmony run --kernel` gives them (its manifest's "host")
    facts = doctor.run_facts(doctor.doctor(mount=False, test_record=False))
    runner = VmRunner(kernels.kernel("debian:6.1"), 4, facts=facts)
    deadline = time.monotonic() + 300
    while True:                     # another Harmony run holds the host: wait, as cli() does
        try:
            runner.__enter__()
            break
        except HostBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
    try:
        runner.capture(exp, params, cpus, tmp_path / "r1", 0)
        runner.flush()
        assert runner.more and runner.jobs == 1
        first = runner.drain()
        assert [r["status"] for r in first] == ["ok"], first
        runner.capture(exp, params, cpus, tmp_path / "r2", 1)
        runner.flush()
        assert runner.jobs == 2 and runner.vm.running
        assert [r["status"] for r in runner.drain()] == ["ok"]
        runner.probe = "no-such-probe"
        runner.capture(exp, params, cpus, tmp_path / "r3", 2)
        with pytest.raises(VmError) as err:
            runner.flush()
    finally:
        runner.__exit__(None, None, None)
    assert str(err.value).startswith("kernel debian:6.1: the guest agent stopped before the end "
                                     "of its runs: ProbeError: unknown probe 'no-such-probe'")
    m3 = store.read_json(tmp_path / "r3" / "manifest.json")
    assert m3["status"] == "incomplete" and "unknown probe 'no-such-probe'" in \
        m3["incomplete_reason"]
    console = (tmp_path / "r1" / "vm-console.log").read_text()
    assert console.count('"event": "facts"') == 1           # one boot for the three jobs
    for d in ("r1", "r2"):
        m = store.read_json(tmp_path / d / "manifest.json")
        assert m["status"] == "complete" and m["under_test"]["kernel"].startswith("6.1.")
        assert m["vm"]["boot_s"] == store.read_json(tmp_path / "r1" / "manifest.json")[
            "vm"]["boot_s"]
        _a_debian_6_1_run_at_4_vcpus(m)
    # the screen says what was measured: the guest's kernel and scheduler, not the host's
    under = store.read_json(tmp_path / "r1" / "manifest.json")["under_test"]
    screen = run_screen(harmony.load(tmp_path / "r1"))
    assert f"measurement: {under['kernel']} / CFS, tracefs probe" in screen, screen
    assert until(lambda: not (_qemu_pids() - before), 10)          # the VM ended with it


@pytest.mark.needs_tool(*VM_TOOLS)
def test_qemu_killed_mid_run_leaves_an_incomplete_run_and_nothing_running(kernel, tmp_path):
    before = _qemu_pids()
    out = tmp_path / "killed"
    deadline = time.monotonic() + 300
    while True:         # wait for the host lock like cli() does
        proc = subprocess.Popen(HARMONY + ["run", "single-source", "--kernel", "debian:6.1",
                                           "--vm-cpus", "4", "--duration", "30", "--out",
                                           str(out)], stderr=subprocess.PIPE, text=True)
        first = proc.stderr.readline()
        if "another Harmony run" not in first or time.monotonic() > deadline:
            break
        proc.wait()
        time.sleep(2)
    lines = [first]
    try:
        while "[1/1]" not in lines[-1]:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
        assert any("[1/1]" in line for line in lines), "".join(lines)
        assert until(lambda: _qemu_pids() - before, 30)
        time.sleep(5)           # inside the run's 30 s
        for pid in _qemu_pids() - before:
            os.kill(pid, signal.SIGKILL)
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = [line for line in (rest or "").splitlines() if line.startswith("harmony: error")]
    assert len(err) == 1 and err[0].startswith("harmony: error: kernel debian:6.1: QEMU died "
                                               "or was killed"), rest
    m = store.read_json(out / "manifest.json")
    assert m["status"] == "incomplete" and "kernel debian:6.1" in m["incomplete_reason"]
    assert until(lambda: not (_qemu_pids() - before), 10)
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit()
                and _comm(p) == "vng" and p.name != str(os.getpid())]


def _comm(p: Path) -> str:
    try:
        return (p / "comm").read_text().strip()
    except OSError:
        return ""


# --- traces recorded elsewhere: trace-cmd record and perf record in a 6.1 guest ----------------

GUEST_WORK = """
import os, time
kids = []
for _ in range(3):                  # three spinners, ~1 s
    if (pid := os.fork()) == 0:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
        os._exit(0)
    kids.append(pid)
r1, w1 = os.pipe()
r2, w2 = os.pipe()
if (pid := os.fork()) == 0:         # a pipe ping-pong: wake-ups across the 4 vCPUs
    for _ in range(2000):
        os.read(r1, 1)
        os.write(w2, b"x")
    os._exit(0)
kids.append(pid)
for _ in range(2000):
    os.write(w1, b"x")
    os.read(r2, 1)
for pid in kids:
    os.waitpid(pid, 0)
"""


#: `trace-cmd record` and `perf record` of GUEST_WORK in a debian:6.1 guest at 4 vCPUs, made once
#: by :func:`record_in_a_debian_6_1_guest` (`python3 -m pytest -m long_build -k recordings` makes
#: them again and checks the fresh ones the same way): a boot is ~50 s of CI, and what the test
#: checks is how Harmony reads such files, not how the guest makes them
GUEST_RECORDINGS = Path(__file__).parent / "data" / "debian-6.1-guest"


def record_in_a_debian_6_1_guest(dest: Path) -> tuple[Path, Path]:
    """What a user brings from another machine: `trace-cmd record` (not extract: trace-cmd's own
    layout and options) and `perf record` (perf on a 6.1 kernel) of 5 tasks on a CFS kernel at 4
    CPUs, recorded in a debian:6.1 guest booted here; returns (trace.dat, perf.data)."""
    from harmony.vm import kernels
    from harmony.vm import machine as vm

    (dest / "work.py").write_text(GUEST_WORK)
    script = dest / "record.sh"
    script.write_text(f"#!/bin/sh\ncd {dest}\n"
                      f"trace-cmd record -q -e sched -o rec.dat -- {sys.executable} work.py "
                      "> trace-cmd.log 2>&1\n"
                      f"perf record -q -e 'sched:*' -a -o perf.data -- {sys.executable} work.py "
                      "> perf.log 2>&1\n")
    script.chmod(0o755)
    argv = vm.vng_argv(kernels.kernel("debian:6.1"), 4, 2048, dest, [str(script)],
                       vm.setting_from_env(), "tcg")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        console, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    dat, data = dest / "rec.dat", dest / "perf.data"
    assert dat.is_file() and data.is_file(), console[-2000:]
    return dat, data


@pytest.mark.needs_tool("trace-cmd", "perf")
def test_recordings_made_in_a_debian_6_1_guest_import(tmp_path, monkeypatch):
    """The recordings made once in a debian:6.1 guest (GUEST_RECORDINGS) read as trace-cmd report
    and perf script print them, and import naming the recording's kernel, its scheduler and its
    CPUs, not this host's."""
    import lzma
    data = tmp_path / "perf.data"       # kept compressed: 7.7 MB as perf wrote it, 0.4 MB so
    data.write_bytes(lzma.decompress((GUEST_RECORDINGS / "perf.data.xz").read_bytes()))
    check_guest_recordings(GUEST_RECORDINGS / "rec.dat", data, tmp_path, monkeypatch)


@pytest.mark.long_build
@pytest.mark.needs_tool(*VM_TOOLS, "trace-cmd", "perf")
def test_recordings_made_again_in_a_debian_6_1_guest_import(kernel, tmp_path, monkeypatch):
    """The same checks on recordings made now, in a debian:6.1 guest booted here."""
    dat, data = record_in_a_debian_6_1_guest(tmp_path)
    check_guest_recordings(dat, data, tmp_path, monkeypatch)


def check_guest_recordings(dat: Path, data: Path, tmp_path: Path, monkeypatch) -> None:
    from test_import_export import decoded_records, report_events
    from test_perf_read import compare_with_perf

    from harmony.probes.tracedat_read import decode_tracedat

    cap, td = decode_tracedat(dat)
    assert td.kernel.startswith("6.1.") and td.n_cpus == 4
    assert decoded_records(cap) == sorted(report_events(dat))
    read = compare_with_perf(data, monkeypatch, "1")
    assert read.header.os_release == td.kernel and read.header.nr_cpus_online == 4

    for name in (dat, data):
        out = tmp_path / f"run-{name.name}"
        p = cli("import", name, "--comm", "python*", "--out", out, "-q")
        assert p.returncode == 0, p.stderr
        m = store.read_json(out / "manifest.json")
        assert m["status"] == "complete"
        assert m["host"]["kernel"] == td.kernel and m["host"]["ncpus"] == 4
        assert m["host"]["scheduler"] == "CFS (implied by kernel 6.1)"
        assert m["cpus"] == [0, 1, 2, 3] and m["lost_events"] == 0
        assert len(store.read_table(out / "tasks.parquet")) == 5
