"""Faults during a real run: a full disk, the tracing instance removed, a worker killed by someone
else, SIGTERM or Ctrl-C at any moment, a suite interrupted and resumed. Each ends with the run
marked incomplete (or refused, or complete if it finished first), one clear line, nothing already
written lost, and the host clean."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_run import HARMONY, cli
from conftest import TRACEFS, pids_with_comm, sigint_as_a_terminal, small_tmpfs, until

import harmony
from harmony.workload.forkserver import COMM as SERVER_COMM


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _comm(pid: int) -> str:
    """A process's comm, "?" once it is gone (it may exit between being listed and read: a
    worker still dying as the host is checked raised ProcessLookupError here)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _host_is_clean() -> list[str]:
    """What a run left on the host: workers, fork servers, tracing instances, cpuset groups. (Not
    this test process's own fork server, which in-process runs of other tests share.)"""
    mine = {p for p in pids_with_comm(SERVER_COMM) if _parent(p) == os.getpid()}
    left = [f"process {p} ({_comm(p)})"
            for p in pids_with_comm("hmy-") + pids_with_comm(SERVER_COMM)
            if p not in mine and _parent(p) not in mine]
    inst = TRACEFS / "instances"
    left += [f"instance {p.name}" for p in inst.iterdir() if p.name.startswith("harmony-")] \
        if inst.is_dir() else []
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpuset")):
        if root.is_dir():
            left += [f"cgroup {p}" for p in root.glob("harmony-*")]
    return left


def _status(out: Path) -> str | None:
    try:
        return json.loads((out / "manifest.json").read_text())["status"]
    except (OSError, ValueError):
        return None


def _wait(fn, timeout_s: float = 30.0):
    """``fn()``'s first true value within ``timeout_s`` (polled), else its last."""
    give_up = time.monotonic() + timeout_s
    while not (value := fn()) and time.monotonic() < give_up:
        time.sleep(0.02)
    return value


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


@pytest.fixture
def clean_host(kernel):
    yield
    assert until(lambda: not _host_is_clean(), 5), _host_is_clean()


# --- SIGTERM and Ctrl-C at any moment ---------------------------------------------------------

#: moments after `harmony run` starts (a 2 s run: start-up, spawn and release, measurement, the
#: end of the window, the analysis)
MOMENTS = [0.3, 0.9, 1.5, 2.4, 3.3, 4.2]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_at_any_moment_leaves_a_marked_run_and_a_clean_host(clean_host, tmp_path, sig):
    seen = []
    for k, at in enumerate(MOMENTS):
        out = tmp_path / f"r{k}"
        # SIGINT as a terminal delivers it, even where the tests run with it ignored (a shell's
        # background job): ignored, Python would never raise KeyboardInterrupt
        proc = subprocess.Popen(HARMONY + ["run", "single-source", "--duration", "2", "--out",
                                           str(out), "-q"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=sigint_as_a_terminal)
        time.sleep(at)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        status = _status(out)
        seen.append((at, proc.returncode, status))
        assert "Traceback" not in err, err
        if proc.returncode == 0:                 # it had finished: a complete run
            assert status == "complete", (at, err)
            continue
        if proc.returncode == 1 and "another Harmony run" in err:
            continue                             # refused: another run held the host
        assert proc.returncode == 128 + sig, (at, proc.returncode, err)
        [line] = _error_lines(err)
        assert line.startswith("harmony: error: ") \
            and ("interrupted" in line or "stopped by" in line)
        # written complete before the signal came (as the summary was printed: a faster
        # analysis finished within 4.2 s on CI): whole, not a stopped run
        assert status in (None, "incomplete", "captured", "complete"), (at, status)
        if status == "complete":
            m = json.loads((out / "manifest.json").read_text())
            assert m["figures"] and all((out / f).is_file() for f in ("summary.json", "report.md"))
        elif status == "captured":               # stopped in the analysis: the capture is kept
            assert "harmony report" in line
            p = cli("report", out)
            assert p.returncode == 0 and _status(out) == "complete", p.stderr
        elif status == "incomplete":
            m = json.loads((out / "manifest.json").read_text())
            assert m["incomplete_reason"] in ("interrupted (Ctrl-C)",
                                              "Interrupted: stopped by SIGTERM"), m
        assert until(lambda: not _host_is_clean(), 5), (at, _host_is_clean())
    # the moments did cover the phases: some run stopped before its end, and one finished
    assert any(rc == 128 + sig for _, rc, _ in seen), seen


# --- a full disk --------------------------------------------------------------------------------

@pytest.fixture
def tiny_disk(tmp_path):
    """A 400 KiB tmpfs: room for the run's start, not for its recording."""
    with small_tmpfs(tmp_path / "tiny", "400k") as mnt:
        yield mnt


def test_a_full_disk_leaves_an_incomplete_run_saying_so(clean_host, tiny_disk):
    out = tiny_disk / "run"
    p = cli("run", "single-source", "--duration", "2", "--out", out)
    assert p.returncode == 1, p.stdout
    [line] = _error_lines(p.stderr)
    assert line.startswith("harmony: error: ") and "No space left on device" in line
    assert "Traceback" not in p.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "incomplete" and "No space left on device" in m["incomplete_reason"]
    assert (out / "tasks.parquet").is_file()                # what was written is still there
    assert sorted(f.name for f in (out / "raw" / "tracefs").glob("cpu*.raw"))
    assert not (out / ".harmony-reserve").exists()           # the space set aside was given back


def test_no_room_to_start_is_refused_with_nothing_left(clean_host, tmp_path):
    with small_tmpfs(tmp_path / "full", "100k") as mnt:
        p = cli("run", "single-source", "--duration", "1", "--out", mnt / "run")
        assert p.returncode == 1
        [line] = _error_lines(p.stderr)
        assert "cannot set 256 KiB aside for the run's manifest (No space left on device)" in line
        assert not (mnt / "run").exists()


# --- the tracing instance, a worker ----------------------------------------------------------

def test_the_kernel_refuses_to_remove_a_recording_instance(clean_host, tmp_path):
    """rmdir of the run's instance while it records: the kernel says EBUSY, and the run ends
    complete (what the kernel allows never corrupts a run)."""
    out = tmp_path / "run"
    proc = subprocess.Popen(HARMONY + ["run", "single-source", "--duration", "3", "--out", str(out),
                                       "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert _wait(lambda: pids_with_comm("hmy-w"))
    time.sleep(1.0)                                     # released, recording
    inst = [p for p in (TRACEFS / "instances").iterdir()     # the run's (not the doctor's)
            if p.name.removeprefix("harmony-").isdigit()]
    assert len(inst) == 1, inst
    r = subprocess.run(["rmdir", str(inst[0])], capture_output=True, text=True)
    _, err = proc.communicate(timeout=60)
    assert r.returncode != 0 and "busy" in r.stderr.lower(), r.stderr
    assert proc.returncode == 0, err
    assert _status(out) == "complete"


def test_a_worker_killed_by_someone_else_makes_the_run_incomplete(clean_host, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(HARMONY + ["run", "single-source", "--duration", "3", "--out", str(out),
                                       "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    victims = _wait(lambda: pids_with_comm("hmy-w01"))
    assert victims
    time.sleep(1.0)                                     # released, measuring
    subprocess.run(["kill", "-9", str(victims[0])], check=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    [line] = _error_lines(err)
    assert line == (f"harmony: error: 1 worker died during the run, not by the experiment's "
                    f"design: hmy-w01 (pid {victims[0]}) killed by SIGKILL")
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "incomplete" and "hmy-w01" in m["incomplete_reason"]
    assert (out / "raw" / "tracefs" / "meta.json").is_file()   # the recording is kept


# --- a suite interrupted, then resumed -----------------------------------------------------------

def test_an_interrupted_suite_resumes(clean_host, tmp_path):
    out = tmp_path / "suite"
    args = ["suite", "--quick", "--experiment", "single-source", "--experiment",
            "intrinsic-imbalance", "--out", str(out), "-q"]
    proc = subprocess.Popen(HARMONY + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=sigint_as_a_terminal)
    # stop it once the first run is captured, as the second of its four starts (its manifest
    # written "running"): two runs and the report are still to come. (Waiting for any worker to
    # be seen instead, CI once sent the signal after the suite had ended: exit 0.)
    assert until(lambda: _status(out / "single-source" / "rep-01") in ("captured", "complete")
                 and _status(out / "single-source" / "rep-02") == "running", 120)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    [line] = _error_lines(err)[-1:]
    assert f"harmony suite --out {out} --resume" in line
    assert until(lambda: not _host_is_clean(), 5), _host_is_clean()
    rep01 = out / "single-source" / "rep-01"
    state, first = _status(rep01), (rep01 / "manifest.json").stat().st_mtime_ns
    p = cli("suite", "--out", out, "--resume", "-q")
    assert p.returncode == 0, p.stderr
    suite = json.loads((out / "suite.json").read_text())
    assert suite["status"] == "complete" and len(suite["resumed_at"]) == 1
    reps = sorted(out.glob("*/rep-[0-9][0-9]/manifest.json"))   # (not those moved aside)
    assert len(reps) == 4 and all(json.loads(m.read_text())["status"] == "complete" for m in reps)
    if state == "complete":         # complete before the interruption: kept as it was
        assert (rep01 / "manifest.json").stat().st_mtime_ns == first
    else:                           # captured: analysed by the resumed suite, not captured again
        assert state == "captured" and not list(out.glob("single-source/rep-01.incomplete-*"))


# --- the controller killed at any moment -------------------------------------------------------

def _live() -> list[str]:
    """Harmony's processes that still run (zombies excluded: init reaps those, see
    bench/controller_death.py), but this test process's own fork server and its children."""
    out = []
    for p in pids_with_comm("hmy-") + pids_with_comm(SERVER_COMM):
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        mine = _parent(p) == os.getpid() or _parent(_parent(p) or 0) == os.getpid()
        if state not in ("Z", "X") and not mine:
            out.append(f"{p} ({state})")
    return out


def test_nothing_runs_on_after_the_controller_is_killed_at_any_moment(clean_host, tmp_path):
    """kill -9 of `harmony run` with 128 tasks while they spawn, wait at the gate, are released,
    run, and are stopped: every worker, occupier and the fork server stop (bench/controller_death
    times it: < 100 ms), and the next `harmony clean` reclaims the rest."""
    phases = set()
    for k, at in enumerate([0.9, 1.2, 1.5, 1.8, 2.2, 2.8, 3.6]):
        proc = subprocess.Popen(HARMONY + ["run", "single-source", "--layout", "128,0",
                                           "--duration", "2", "--out", str(tmp_path / f"r{k}"),
                                           "-q"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(at)
        phases.add(len(pids_with_comm("hmy-w")) > 0)
        proc.kill()
        proc.wait()
        assert _wait(lambda: not _live(), 5.0), (at, _live())
        p = cli("clean")
        assert p.returncode == 0, p.stderr
        # killed while analysing: "captured", which `harmony suite --resume` analyses again;
        # "complete" only where the run was written whole before the kill came (it had ended)
        status = _status(tmp_path / f"r{k}")
        assert status in (None, "running", "incomplete", "captured", "complete"), at
        if status == "complete":
            assert harmony.load(tmp_path / f"r{k}").complete, at
    assert True in phases, "no kill came while the workers existed"


# --- a VM's controller killed at any moment -----------------------------------------------------

#: what a VM runs on the host, by command name (the reaper is python: found by its script)
VM_COMMS = ("qemu-system", "vng", "virtme-run", "virtiofsd")


def _vm_processes() -> set[str]:
    out = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            reaper = b"harmony/vm/reaper.py" in (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and (comm.startswith(VM_COMMS) or reaper):
            out.add(f"{entry.name} {comm}")
    return out


@pytest.mark.needs_tool("qemu-system-x86_64", "vng", "busybox")
@pytest.mark.parametrize("moment", ["boot", "measuring", "done"])
def test_a_vm_dies_with_its_controller_at_any_moment(clean_host, tmp_path, moment):
    """kill -9 of `harmony run --kernel debian:6.1 --repeat 2` while the guest boots, mid-capture
    (its first run's window) and between its two runs: 1 s later no QEMU, virtme-ng, virtiofsd
    or reaper of it runs (bench/controller_death.py --kernel times each moment, a fourth too);
    the next `harmony clean` has nothing of it to reclaim. Two boots of ~30-40 s each under TCG
    (the boot moment needs none): the moments a VM has that a host run has not."""
    before = _vm_processes()
    out = tmp_path / "r"
    console = out / "vm-console.log"
    deadline = time.monotonic() + 300
    while True:                 # another Harmony run holds the host: wait, as cli() does
        proc = subprocess.Popen(HARMONY + ["run", "single-source", "--kernel", "debian:6.1",
                                           "--vm-cpus", "2", "--duration", "1", "--repeat", "2",
                                           "--out", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        first = proc.stderr.readline()
        if "another Harmony run" not in first or time.monotonic() > deadline:
            break
        proc.wait()
        time.sleep(2)
    try:
        if moment == "boot":
            assert _wait(lambda: _vm_processes() - before, 60), "no VM started"
            time.sleep(3)
            assert not console.exists() or '"facts"' not in console.read_text()
        else:
            want = f'"event": "{moment}", '
            assert _wait(lambda: console.exists() and any(
                want in line and '"run": 0' in line for line in console.read_text().splitlines()),
                600), console.read_text()[-2000:] if console.exists() else first
        assert _vm_processes() - before, "the VM was gone before the kill"
        proc.kill()
        proc.wait()
        assert _wait(lambda: not (_vm_processes() - before), 1.0), (moment,
                                                                    _vm_processes() - before)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    p = cli("clean")
    assert p.returncode == 0 and "VM process" not in p.stdout + p.stderr, p.stdout + p.stderr
