"""harmony.doctor: the checks, their rendering and the verdict (real host where it matters)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harmony import hostfacts
from harmony.doctor import CHECKS, check_cgroup, check_tracefs, doctor, format_doctor
from harmony.probes.base import REQUIRED_TRACEPOINTS
from harmony.probes.tracefs import DOCTOR_INSTANCE_PREFIX
from harmony.workload.controller import release_check

from conftest import host_skip


def _write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


# ---------------------------------------------------------------------------- hermetic checks


def test_tracefs_not_mounted_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(hostfacts, "mountpoints", lambda fstype: [])
    monkeypatch.setattr(hostfacts, "TRACEFS_DEFAULT", tmp_path / "tracing")
    monkeypatch.setattr(hostfacts, "TRACEFS_LEGACY", tmp_path / "debug/tracing")
    monkeypatch.setattr(hostfacts, "is_root", lambda: False)
    (tmp_path / "tracing").mkdir()
    check = check_tracefs(mount=True)
    assert check["status"] == "missing" and check["mounted"] is False \
        and not check["mounted_by_doctor"]
    assert "not mounted" in check["detail"]


def test_cgroup_unified_with_cpuset(tmp_path, monkeypatch):
    cg = tmp_path / "cg"
    _write(cg / "cgroup.controllers", "cpuset cpu io memory pids")
    _write(tmp_path / "proc/mounts",
           f"cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\ncgroup2 {cg} cgroup2 rw 0 0")
    monkeypatch.setattr(hostfacts, "PROC", tmp_path / "proc")
    check = check_cgroup()
    assert check["v2_mounted"] and check["unified"] and check["v2_path"] == "/sys/fs/cgroup"
    # the real /sys/fs/cgroup may differ; point at the fake one instead
    _write(tmp_path / "proc/mounts",
           f"cgroup2 {cg} cgroup2 rw 0 0\ncgroup /x/cpuset cgroup rw,cpuset 0 0")
    check = check_cgroup()
    assert check["cpuset_v2"] and check["status"] == "ok" and check["unified"] is False
    _write(tmp_path / "proc/mounts", "cgroup /x/cpuset cgroup rw,cpuset 0 0")
    check = check_cgroup()
    assert check["status"] == "ok" and check["cpuset_v1"] == "/x/cpuset"  # the release uses v1
    _write(tmp_path / "proc/mounts", "proc /proc proc rw 0 0")
    assert check_cgroup()["status"] == "missing"


def test_format_doctor_not_runnable_lists_reasons():
    facts = {name: {"status": "missing", "detail": f"{name} detail"} for name in CHECKS}
    facts["verdict"] = {"can_run": False, "probes": [],
                        "reasons": ["not running as root (euid 1000)"], "unavailable": {}}
    out = format_doctor(facts)
    assert "cannot run" in out and "not running as root" in out
    for name in CHECKS:
        assert name in out


# --------------------------------------------------------------------------------- the doctor


def _doctor_instances(tracefs: Path) -> list[str]:
    return [p.name for p in (tracefs / "instances").iterdir()
            if p.name.startswith("harmony-doctor")]


def _enabled_sched_events(tracefs: Path) -> dict[str, str]:
    return {t: (tracefs / f"events/sched/{t}/enable").read_text().strip()
            for t in REQUIRED_TRACEPOINTS}


@pytest.fixture(scope="module")
def real_facts(kernel):
    tracefs = kernel
    before = _enabled_sched_events(tracefs)
    facts = doctor()
    return facts, before, tracefs


@pytest.mark.kernel
def test_doctor_real_host(real_facts):
    facts, before, tracefs = real_facts
    json.dumps(facts)
    assert facts["root"]["root"] is True
    assert facts["tracefs"]["mounted"] is True
    assert "sched_switch" in facts["sched_tracepoints"]["present"]
    assert facts["tracefs_instances"]["creatable"] and facts["tracefs_instances"]["removed"]
    assert facts["verdict"]["can_run"] is True
    assert facts["verdict"]["probes"], facts["verdict"]
    assert set(facts["verdict"]["probes"]) <= {"tracefs", "perf", "pyperf"}
    assert facts["verdict"]["reasons"] == []
    # each fact against the kernel's own files and tools, read here without Harmony's code
    assert facts["online_cpus"] == _cpu_list(Path("/sys/devices/system/cpu/online").read_text())
    assert facts["topology"]["counts"]["threads"] == os.sysconf("SC_NPROCESSORS_ONLN")
    assert facts["kernel"]["release"] == os.uname().release
    assert facts["scheduler"]["name"] == _scheduler_as_the_kernel_shows_it()
    for name in CHECKS:
        assert facts[name]["status"] in ("ok", "warn", "missing"), name
        assert isinstance(facts[name]["detail"], str) and "\n" not in facts[name]["detail"], name
    # the python-perf probe's check says whether the binding loads, and why not
    b = facts["pyperf"]["binding"]
    assert b["loaded"] == (b["why_not"] is None) and b["python"]
    assert (facts["pyperf"]["status"] == "missing") == (b["path"] is None)
    perf = shutil.which("perf")
    assert facts["perf"]["present"] == (perf is not None)
    assert facts["perf"]["paranoid"] == int(
        Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    if perf is not None:        # its version as perf prints it
        said = subprocess.run([perf, "--version"], capture_output=True, text=True).stdout
        assert facts["perf"]["version"] and facts["perf"]["version"] in said, said


def _cpu_list(text: str) -> list[int]:
    """The CPUs of a kernel CPU list ("0-3,8,10-11")."""
    out = []
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def _scheduler_as_the_kernel_shows_it() -> str:
    """The normal tasks' scheduler from the kernel's own files: an enabled sched_ext scheduler's
    ops name, else EEVDF or CFS by the tunable the fair class's debugfs directory has
    (base_slice_ns is EEVDF's, min_granularity_ns CFS's), not by the release."""
    scx = Path("/sys/kernel/sched_ext")
    if (scx / "state").exists() and (scx / "state").read_text().strip() == "enabled":
        return (scx / "root" / "ops").read_text().strip()
    debug = Path("/sys/kernel/debug/sched")
    if (debug / "base_slice_ns").exists():
        return "EEVDF"
    if (debug / "min_granularity_ns").exists():
        return "CFS"
    host_skip(f"{debug} is not there to read the fair class's tunables from")


@pytest.mark.kernel
def test_doctor_leaves_no_state(real_facts):
    facts, before, tracefs = real_facts
    assert _doctor_instances(tracefs) == []
    assert _enabled_sched_events(tracefs) == before


@pytest.mark.kernel
def test_doctor_reclaims_stale_instance(kernel):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = kernel / "instances" / f"{DOCTOR_INSTANCE_PREFIX}{dead.pid}"
    stale.mkdir()
    try:
        facts = doctor(mount=False)
        assert stale.name in facts["tracefs_instances"]["reclaimed"]
        assert not stale.exists()
        assert _doctor_instances(kernel) == []
    finally:
        if stale.exists():
            stale.rmdir()


@pytest.mark.kernel
def test_format_doctor_real_host(real_facts):
    facts, _, _ = real_facts
    out = format_doctor(facts)
    for name in CHECKS:
        assert name in out, name
    assert "verdict" in out and "can run" in out
    header = out.splitlines()[0]
    assert header.split() == ["CHECK", "STATUS", "DETAIL"]
    # the status column is aligned
    col = header.index("STATUS")
    for line in out.splitlines()[1 : len(CHECKS) + 2]:
        assert line[col:].split()[0] in ("ok", "warn", "missing"), line


def test_doctor_simulated_non_root(monkeypatch):
    monkeypatch.setattr(hostfacts, "is_root", lambda: False)
    facts = doctor(mount=False)
    json.dumps(facts)
    assert facts["root"]["root"] is False and facts["root"]["status"] == "warn"
    v = facts["verdict"]
    assert v["can_run"] is False
    assert v["reasons"] and any("root" in r for r in v["reasons"])
    assert all("\n" not in r for r in v["reasons"])
    out = format_doctor(facts)
    assert "cannot run" in out
    if Path("/sys/kernel/tracing/instances").is_dir() and os.geteuid() == 0:
        assert _doctor_instances(Path("/sys/kernel/tracing")) == []


def test_release_check_says_which_release_a_run_would_use(monkeypatch):
    two, one = {"online": [0, 1]}, {"online": [0]}
    monkeypatch.delenv("HARMONY_RELEASE_MODE", raising=False)
    assert release_check({"state": "enabled"}, two)["mode"] == "confined"
    assert "sched_ext" in release_check({"state": "enabled"}, two)["why"]
    assert release_check({"state": "not built"}, one)["why"] == "one CPU"
    monkeypatch.setattr(os, "sched_setscheduler",
                        lambda *a: (_ for _ in ()).throw(PermissionError(1, "no")))
    got = release_check({"state": "not built"}, two)
    assert got["mode"] == "confined" and got["why"].startswith("SCHED_FIFO not permitted")
    monkeypatch.undo()
    monkeypatch.setenv("HARMONY_RELEASE_MODE", "confined")
    assert release_check({"state": "not built"}, two)["why"] == "HARMONY_RELEASE_MODE=confined"
    monkeypatch.setenv("HARMONY_RELEASE_MODE", "bogus")
    assert release_check({"state": "not built"}, two)["status"] == "warn"
    monkeypatch.delenv("HARMONY_RELEASE_MODE")
    if os.geteuid() == 0:
        before = os.sched_getscheduler(0)
        assert release_check({"state": "not built"}, two)["mode"] == "occupied"
        assert os.sched_getscheduler(0) == before       # the try is undone


def test_the_kernel_config_a_vm_runner_names_is_read_first(tmp_path, monkeypatch):
    """A guest's /boot is the host's and a Debian kernel has no /proc/config.gz: the VM runner
    names the kernel's config (HARMONY_KERNEL_CONFIG) and the facts read its HZ from there."""
    from harmony import doctor

    conf = tmp_path / "kernel-config"
    conf.write_text("CONFIG_HZ_250=y\nCONFIG_HZ=250\nCONFIG_PREEMPT_VOLUNTARY=y\n")
    monkeypatch.setenv(hostfacts.KERNEL_CONFIG_ENV, str(conf))
    config, source = hostfacts.kernel_config("no-such-release")
    assert source == str(conf) and hostfacts.config_hz(config) == 250
    assert doctor.check_hz(config, source)["hz"] == 250
    monkeypatch.setenv(hostfacts.KERNEL_CONFIG_ENV, str(tmp_path / "gone"))
    monkeypatch.setattr(hostfacts, "PROC", tmp_path / "proc")        # no /proc/config.gz
    assert hostfacts.kernel_config("no-such-release") == ({}, None)  # then /boot, /proc: none


def test_a_stop_just_after_the_doctor_made_its_instance_leaves_none(kernel, monkeypatch):
    """A Ctrl-C landing as mkdir returns, before the check noted the instance made (CI: a run
    stopped 0.3 s in, in its doctor's check, left harmony-doctor-<pid>): removed all the same."""
    from harmony.probes.tracefs import TracefsProbe

    real_mkdir = Path.mkdir

    def mkdir_then_stop(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if self.name.startswith("harmony-doctor"):
            raise KeyboardInterrupt
    monkeypatch.setattr(Path, "mkdir", mkdir_then_stop)
    with pytest.raises(KeyboardInterrupt):
        TracefsProbe.doctor_check({"tracefs": {"path": str(kernel)}})
    monkeypatch.undo()
    assert _doctor_instances(kernel) == []
    # one a stopped doctor left all the same (a dead pid's): the next clean-up reclaims it
    (kernel / "instances" / "harmony-doctor-4194303").mkdir()
    assert "tracefs instance harmony-doctor-4194303" in TracefsProbe.reclaim_stale()
    assert _doctor_instances(kernel) == []
