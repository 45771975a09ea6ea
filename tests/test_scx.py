"""sched_ext schedulers under test, without a sched_ext kernel: names, arguments, the command, the
refusals before anything starts, and the scheduler's life cycle (start, enabled, ejected, stopped,
a verifier's refusal) against a stand-in sched_ext directory driven by a real process. Also the
sched-ext kernel's cache key and seed matching (harmony.vm.kernels)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harmony.core import osutil
from harmony.core.errors import ParameterError, ScxError, UnknownScheduler
from harmony.vm import kernels, scx, scx_build

HARMONY = [sys.executable, "-m", "harmony.cli"]


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _build_dir(tmp_path: Path) -> Path:
    d = tmp_path / "build"
    d.mkdir()
    for binary in scx.KNOWN.values():
        _exe(d / binary, "#!/bin/sh\nexit 0\n")
    return d


# --- names, arguments, command -----------------------------------------------------------------

def test_known_names_are_found_in_the_kernel_build(tmp_path):
    d = _build_dir(tmp_path)
    for name, binary in scx.KNOWN.items():
        for given in (name, binary):
            spec = scx.resolve(given, None, d)
            assert spec.name == name and spec.path == str(d / binary) and spec.args == ()


def test_arguments_split_as_a_shell_would_and_the_command(tmp_path):
    spec = scx.resolve("simple", "-v --slice-us '20 000'", _build_dir(tmp_path))
    assert spec.args == ("-v", "--slice-us", "20 000")
    assert spec.command() == ["setpriv", "--pdeathsig", "KILL", spec.path, "-v", "--slice-us",
                              "20 000"]
    assert scx.ScxSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_a_path_is_any_executable(tmp_path):
    mine = _exe(tmp_path / "my_sched", "#!/bin/sh\n")
    spec = scx.resolve(str(mine))
    assert spec.path == str(mine) and spec.name == str(mine)
    (tmp_path / "not_exec").write_text("x")
    with pytest.raises(UnknownScheduler, match="no such executable"):
        scx.resolve(str(tmp_path / "not_exec"))


@pytest.mark.parametrize("name, args, match", [
    ("fast", None, "unknown scheduler 'fast': give one of simple, central, qmap, flatcg, "
                   "bpfland, rusty, lavd"),
    ("simple", "'unclosed", "--scx-args"),
    ("./nowhere/scx", None, "no such executable"),
])
def test_bad_names_and_arguments_are_one_line_parameter_errors(tmp_path, name, args, match):
    with pytest.raises(UnknownScheduler, match=match) as err:
        scx.resolve(name, args, _build_dir(tmp_path))
    assert isinstance(err.value, ParameterError) and "\n" not in str(err.value)


def test_a_known_name_without_a_kernel_build(tmp_path):
    with pytest.raises(UnknownScheduler, match="harmony kernel build sched-ext"):
        scx.resolve("simple", None, None)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UnknownScheduler, match="missing from the kernel build"):
        scx.resolve("qmap", None, empty)


def test_real_time_and_deadline_tasks_are_refused(tmp_path):
    for params in ({"policy": "fifo"}, {"policy": "rr"}, {"policy": "deadline"},
                   {"policy": "other", "heavy_policy": "fifo"}):
        with pytest.raises(ParameterError, match="scx issue 1202"):
            scx.check_params(params)
    scx.check_params({"policy": "other", "high_policy": None, "low_policy": "batch"})


def test_a_kernel_without_sched_ext(tmp_path):
    with pytest.raises(ScxError, match=r"has no sched_ext .*absent"):
        scx.check_kernel(tmp_path / "sched_ext")


# --- what a scheduler prints --------------------------------------------------------------------

VERIFIER_LOG = """libbpf: prog 'simple_enqueue': BPF program load failed: Permission denied
libbpf: prog 'simple_enqueue': -- BEGIN PROG LOAD LOG --
0: R1=ctx() R10=fp0
; s32 BPF_STRUCT_OPS(simple_enqueue, struct task_struct *p, u64 enq_flags)
1: (79) r6 = *(u64 *)(r1 +0)
R2 invalid mem access 'scalar'
processed 12 insns (limit 1000000) max_states_per_insn 0 total_states 1
-- END PROG LOAD LOG --
libbpf: prog 'simple_enqueue': failed to load: -13
libbpf: failed to load object 'scx_simple'
"""


def test_the_verifiers_reason_and_the_exit_reason():
    assert scx.failure_line(VERIFIER_LOG) == (
        "verifier rejected simple_enqueue: R2 invalid mem access 'scalar' (processed 12 insns "
        "(limit 1000000) max_states_per_insn 0 total_states 1)")
    coloured = ("\x1b[2m2026-11-26T12:32:45Z\x1b[0m \x1b[33m WARN\x1b[0m libbpf: failed\n"
                "Error: EINVAL\n")
    assert scx.failure_line(coloured) == "Error: EINVAL"
    assert scx.failure_line("usage: scx_simple [-v]\n") == "usage: scx_simple [-v]"
    assert scx.failure_line("") == "no output"
    log = "local=1 global=2\nEXIT: runnable task stall (kworker/0:1[12] failed to run for 30s)\n"
    assert scx.exit_reason(log) == "runnable task stall (kworker/0:1[12] failed to run for 30s)"
    assert scx.exit_reason("local=1 global=2\n") is None


# --- the life cycle, against a stand-in sched_ext directory -------------------------------------

def _root(tmp_path: Path, state: str = "disabled") -> Path:
    root = tmp_path / "sched_ext"
    (root / "root").mkdir(parents=True)
    (root / "state").write_text(state + "\n")
    (root / "root" / "ops").write_text("\n")
    return root


def _scheduler(tmp_path: Path, root: Path, then: str = "") -> Path:
    """A stand-in scheduler: enables the stand-in sched_ext, says EXIT on SIGINT as the scx
    schedulers do; ``then``: what it does after it is enabled (else it waits). Its one line of
    output comes before it is enabled, so a run that stops right after the start has it."""
    return _exe(tmp_path / "scx_fake", f"""#!/bin/sh
stop() {{ echo disabled > {root}/state; echo "EXIT: unregistered from user space" >&2; exit 0; }}
trap stop INT
echo "local=0 global=0"
echo fake > {root}/root/ops
echo enabled > {root}/state
{then}
while :; do sleep 0.05; done
""")


def test_started_enabled_watched_and_stopped(tmp_path):
    root = _root(tmp_path)
    s = scx.Scheduler(scx.ScxSpec("fake", str(_scheduler(tmp_path, root)), ("-v",)),
                      tmp_path / "scx.log", root=root)
    s.start()
    try:
        assert s.ops == "fake" and s.ejected() is None and s.tids()
        assert osutil.record_path("scx").exists()      # for the next start, if this one dies
    finally:
        rec = s.stop()
    assert rec["enabled_throughout"] and rec["ejected"] is None and rec["ops"] == "fake"
    assert rec["args"] == ["-v"] and rec["exit"] == "unregistered from user space"
    assert rec["state_after"] == "disabled" and rec["returncode"] == 0
    assert not osutil.record_path("scx").exists() and s.stop() is rec


def test_an_ejection_is_seen_with_the_schedulers_reason(tmp_path):
    root = _root(tmp_path)
    eject = (f"sleep 0.6; echo disabled > {root}/state; "
             "echo 'EXIT: disabled by sysrq-S' >&2; exit 0")
    s = scx.Scheduler(scx.ScxSpec("fake", str(_scheduler(tmp_path, root, eject))),
                      tmp_path / "scx.log", root=root)
    s.start()
    deadline = time.monotonic() + 10
    while s.ejected() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s.ejected() == "disabled by sysrq-S"
    rec = s.stop()
    assert not rec["enabled_throughout"] and rec["ejected"] == "disabled by sysrq-S"
    assert rec["states"][0] == [0.0, "enabled"] and rec["states"][-1][1] == "disabled"


def test_a_scheduler_killed_mid_run_is_an_ejection(tmp_path):
    root = _root(tmp_path)
    s = scx.Scheduler(scx.ScxSpec("fake", str(_scheduler(tmp_path, root))),
                      tmp_path / "scx.log", root=root)
    s.start()
    os.kill(s.proc.pid, signal.SIGKILL)
    s.proc.wait()
    assert s.ejected().startswith("its process ended (status -9)")
    assert not s.stop()["enabled_throughout"]


def test_a_kept_scheduler_is_loaded_once_for_many_runs(tmp_path):
    """A boot's runs share one load: the first run's view starts it, the next finds it enabled
    (no enable time of its own), each record covers its own run (states, the output written
    meanwhile), and close() stops it."""
    root = _root(tmp_path)
    kept = scx.Kept(scx.ScxSpec("fake", str(_scheduler(tmp_path, root))), tmp_path, root=root)
    records = []
    for k in range(2):
        (tmp_path / f"r{k}").mkdir()
        view = kept.for_run(tmp_path / f"r{k}" / "scx.log")
        view.start()
        assert view.ops == "fake" and view.ejected() is None and view.tids()
        records.append(view.stop())
    first, second = records
    assert first["enable_s"] is not None and second["enable_s"] is None
    assert first["pid"] == second["pid"] and kept.sched.proc.poll() is None
    assert second["loaded_since"] == str(tmp_path / "r0") and second["restarted_after"] is None
    assert all(r["enabled_throughout"] and r["states"] == [[0.0, "enabled"]] for r in records)
    assert "local=0 global=0" in (tmp_path / "r0" / "scx.log").read_text()
    assert (tmp_path / "r1" / "scx.log").read_text() == ""      # it said nothing meanwhile
    assert kept.close()["exit"] == "unregistered from user space"
    assert (root / "state").read_text().strip() == "disabled" and kept.sched is None


def test_the_kept_schedulers_last_record_reaches_the_suite(tmp_path, monkeypatch):
    """A boot's kept scheduler, stopped at its end: its last record (exit reason, state after)
    is what guest.Boot.close returns (the agent's "schedulers" line at its end), what the VM
    runner keeps from that line (_at_end), suite.json records (``scheduler_ended``) and the
    report says in one line."""
    from types import SimpleNamespace

    from test_until_decided import CPUS, PARAMS, LabelRunner, _policy

    from harmony import suite
    from harmony.analysis import report_suite
    from harmony.vm import guest
    from harmony.vm.runner import VmRunner

    root = _root(tmp_path)
    boot = guest.Boot()
    kept = scx.Kept(scx.ScxSpec("fake", str(_scheduler(tmp_path, root))), tmp_path, root=root)
    boot.schedulers["fake"] = kept
    (tmp_path / "r0").mkdir()
    view = kept.for_run(tmp_path / "r0" / "scx.log")
    view.start()
    view.stop()
    records = boot.close()
    assert [(r["name"], r["exit"], r["state_after"]) for r in records] == \
        [("fake", "unregistered from user space", "disabled")]
    assert boot.close() == [] and kept.sched is None
    host = SimpleNamespace(schedulers_ended=[])
    VmRunner._at_end(host, {"event": "end", "failed": 0}, 0.0)
    VmRunner._at_end(host, json.loads(json.dumps({"event": "schedulers", "records": records})),
                     0.0)
    assert host.schedulers_ended == records
    monkeypatch.setattr(report_suite, "write", lambda out, note=None: None)
    runner = LabelRunner(_policy("poly-balance"))
    runner.schedulers_ended = host.schedulers_ended
    configs = [suite.Config("how-many", {}, 1, "how-many", params=dict(PARAMS))]
    record = suite.run_suite(configs, CPUS, tmp_path / "s", runner, quiet=True)
    assert json.loads((tmp_path / "s" / "suite.json").read_text())["scheduler_ended"] == records
    assert record["scheduler_ended"] == records
    assert report_suite.scheduler_ended_text(records[0]) == (
        "sched_ext scheduler fake kept across the runs, at the end: state after: disabled; "
        "exit: unregistered from user space; return code 0")


def test_a_kept_scheduler_ejected_is_said_and_started_again(tmp_path):
    root = _root(tmp_path)
    kept = scx.Kept(scx.ScxSpec("fake", str(_scheduler(tmp_path, root))), tmp_path, root=root)
    (tmp_path / "r0").mkdir()
    view = kept.for_run(tmp_path / "r0" / "scx.log")
    view.start()
    pid = kept.sched.proc.pid
    (root / "state").write_text("disabled\n")          # the kernel ejects it mid-run
    kept.sched.proc.kill()
    rec = view.stop()
    assert not rec["enabled_throughout"] and rec["ejected"] and kept.sched is None
    (tmp_path / "r1").mkdir()
    view = kept.for_run(tmp_path / "r1" / "scx.log")
    view.start()                                          # a fresh load for the next run
    try:
        assert view.enable_s is not None and kept.sched.proc.pid != pid
    finally:
        view.stop()
        kept.close()


def test_a_verifier_refusal_is_one_line_with_its_reason(tmp_path):
    root = _root(tmp_path)
    log = tmp_path / "verifier.txt"
    log.write_text(VERIFIER_LOG)
    bad = _exe(tmp_path / "scx_bad", f"#!/bin/sh\ncat {log} >&2\nexit 1\n")
    s = scx.Scheduler(scx.ScxSpec("bad", str(bad)), tmp_path / "scx.log", root=root)
    with pytest.raises(ScxError) as err:
        s.start()
    assert str(err.value) == ("scheduler bad exited before it was enabled (status 1): verifier "
                              "rejected simple_enqueue: R2 invalid mem access 'scalar' (processed "
                              "12 insns (limit 1000000) max_states_per_insn 0 total_states 1)")
    assert not osutil.record_path("scx").exists()


def test_a_scheduler_never_enabled_is_stopped(tmp_path):
    root = _root(tmp_path)
    slow = _exe(tmp_path / "scx_slow", "#!/bin/sh\nexec sleep 60\n")
    s = scx.Scheduler(scx.ScxSpec("slow", str(slow)), tmp_path / "scx.log", root=root,
                      enable_timeout_s=0.5)
    with pytest.raises(ScxError, match="not enabled within 0 s"):
        s.start()
    assert s.proc.poll() is not None


def test_a_scheduler_enabled_by_someone_else_is_refused(tmp_path):
    root = _root(tmp_path, "enabled")
    (root / "root" / "ops").write_text("rusty\n")
    s = scx.Scheduler(scx.ScxSpec("fake", "/bin/true"), tmp_path / "scx.log", root=root)
    with pytest.raises(ScxError, match=r"enabled already \(ops rusty\)"):
        s.start()
    assert s.proc is None


def test_the_scheduler_of_a_dead_run_is_stopped_by_the_next(tmp_path):
    """A record whose controller is gone: its scheduler (the same pid and start time) is
    stopped; a record of a live controller is left alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = subprocess.Popen(["sleep", "60"])
    try:
        path = osutil.record_path("scx", dead.pid)
        path.write_text(json.dumps({
            "controller_pid": dead.pid, "controller_start": 1, "scheduler": "simple",
            "pids": [{"pid": left.pid, "start": scx.proc_starttime(left.pid)}]}))
        mine = osutil.record_path("scx", os.getpid())
        mine.write_text(json.dumps({
            "controller_pid": os.getpid(), "controller_start": scx.proc_starttime(os.getpid()),
            "pids": [{"pid": left.pid, "start": scx.proc_starttime(left.pid)}]}))
        removed = scx.reclaim_stale()
        assert removed == [f"sched_ext scheduler {left.pid} (sleep) of a dead run"]
        assert left.wait(timeout=10) == -signal.SIGINT and not path.exists()
        assert mine.exists()
    finally:
        left.kill()
        osutil.record_path("scx", os.getpid()).unlink(missing_ok=True)


# --- the sched-ext kernel: key, seed --------------------------------------------------------------

def _bzimage(path: Path, release: str) -> None:
    head = bytearray(0x400)
    head[0x202:0x206] = b"HdrS"
    head[0x20E:0x210] = (0x300 - 0x200).to_bytes(2, "little")
    text = f"{release} (builder@host) #1 SMP".encode()
    head[0x300:0x300 + len(text)] = text
    path.write_bytes(bytes(head))


def _seed(tmp_path: Path, config: bytes, release: str = "6.12.117") -> tuple[Path, dict]:
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "config.gz").write_bytes(gzip.compress(config))
    _bzimage(seed / "bzImage", release)
    rec = {**kernels.recipe("sched-ext"),
           "config_sha256": {"6.12.117-1~deb12u1": hashlib.sha256(config).hexdigest()}}
    for s in rec["schedulers"]:
        _exe(seed / s, "#!/bin/sh\n")
    return seed, rec


def test_the_build_key_follows_what_makes_the_build():
    rec = kernels.recipe("sched-ext")
    key = kernels.build_key(rec, "6.12.117-1~deb12u1", "1.42")
    assert key == kernels.build_key(dict(rec), "6.12.117-1~deb12u1", "1.42") and len(key) == 16
    assert key != kernels.build_key(rec, "6.12.118-1~deb12u1", "1.42")
    assert key != kernels.build_key(rec, "6.12.117-1~deb12u1", "1.43")
    more = {**rec, "configitems": rec["configitems"] + ["CONFIG_PREEMPT=y"]}
    assert key != kernels.build_key(more, "6.12.117-1~deb12u1", "1.42")
    # what the recipe records of a build's result is not part of what makes it
    assert key == kernels.build_key({**rec, "config_sha256": {}}, "6.12.117-1~deb12u1", "1.42")
    assert "CONFIG_SCHED_CLASS_EXT=y" in rec["configitems"]
    assert rec["schedulers"] == [scx.KNOWN[n] for n in scx.KNOWN]


def test_a_seed_matches_only_the_config_the_recipe_makes(tmp_path):
    seed, rec = _seed(tmp_path, b"CONFIG_SCHED_CLASS_EXT=y\n")
    assert kernels.seed_matches(rec, seed, "6.12.117-1~deb12u1") == (True, "")
    ok, why = kernels.seed_matches(rec, seed, "6.12.118-1~deb12u1")
    assert not ok and "records no config" in why
    (seed / "config.gz").write_bytes(gzip.compress(b"CONFIG_SCHED_CLASS_EXT=n\n"))
    ok, why = kernels.seed_matches(rec, seed, "6.12.117-1~deb12u1")
    assert not ok and "is not the config the recipe makes" in why
    (seed / "config.gz").write_bytes(b"not gzip")
    assert not kernels.seed_matches(rec, seed, "6.12.117-1~deb12u1")[0]


def test_a_seed_of_another_release_or_without_a_scheduler(tmp_path):
    seed, rec = _seed(tmp_path, b"x\n", release="6.12.116")
    ok, why = kernels.seed_matches(rec, seed, "6.12.117-1~deb12u1")
    assert not ok and "release 6.12.116, not 6.12.117" in why
    _bzimage(seed / "bzImage", "6.12.117")
    (seed / "scx_qmap").unlink()
    ok, why = kernels.seed_matches(rec, seed, "6.12.117-1~deb12u1")
    assert not ok and "lacks scx_qmap" in why


def test_seeding_the_cache(tmp_path, monkeypatch):
    seed, rec = _seed(tmp_path, b"CONFIG_SCHED_CLASS_EXT=y\n")
    monkeypatch.setattr(kernels, "recipe", lambda name: rec)
    k = kernels.seed("sched-ext", tmp_path / "cache", "6.12.117-1~deb12u1", seed)
    key = kernels.build_key(rec, "6.12.117-1~deb12u1")
    assert k.image == tmp_path / "cache" / f"sched-ext_{key}" / "bzImage"
    assert k.release == "6.12.117" and k.spec == "sched-ext"
    assert k.source["from"] == "seed" and k.source["seed"] == str(seed)
    assert all((k.image.parent / s).is_file() for s in rec["schedulers"])
    assert "seeded from" in k.describe()
    assert [c.spec for c in kernels.cached(tmp_path / "cache")] == ["sched-ext"]
    (seed / "config.gz").write_bytes(gzip.compress(b"other\n"))
    with pytest.raises(kernels.KernelError, match="cannot seed the cache"):
        kernels.seed("sched-ext", tmp_path / "other", "6.12.117-1~deb12u1", seed)


def test_seed_dir_from_the_environment_or_beside_the_checkout_or_the_current_dir(tmp_path,
                                                                               monkeypatch):
    monkeypatch.delenv("HARMONY_KERNEL_SEED", raising=False)
    monkeypatch.chdir(tmp_path)
    checkout = Path(kernels.__file__).resolve().parents[2]
    beside = [a / "shared" / "kernels" / "sched-ext-6.12" for a in checkout.parents]
    found = next((d for d in beside if d.is_dir()), None)
    if found is not None:         # a shared directory above the checkout (a clone, a worktree)
        assert kernels.seed_dir("sched-ext") == found
    else:                         # none: the first place looked, for messages
        assert kernels.seed_dir("sched-ext") == checkout.parent / "shared" / "kernels" \
            / "sched-ext-6.12"
    # a clone with no shared directory anywhere above it nor the current one: the one beside
    # the clone is named (harmony/shared/kernels/... inside the package was, 2026-12-07)
    lone = tmp_path / "a" / "clone"
    (lone / "harmony" / "vm").mkdir(parents=True)
    monkeypatch.chdir(lone)
    monkeypatch.setattr(kernels, "__file__", str(lone / "harmony" / "vm" / "kernels.py"))
    if not any((d / "shared").is_dir() for d in tmp_path.parents):
        assert kernels.seed_dir("sched-ext") == tmp_path / "a" / "shared" / "kernels" \
            / "sched-ext-6.12"
    # an install elsewhere, used from a directory below a shared one
    monkeypatch.setattr(kernels, "__file__", "/nonexistent/site-packages/harmony/vm/kernels.py")
    (tmp_path / "shared" / "kernels" / "sched-ext-6.12").mkdir(parents=True)
    (tmp_path / "clone").mkdir()
    monkeypatch.chdir(tmp_path / "clone")
    assert kernels.seed_dir("sched-ext") == tmp_path / "shared" / "kernels" / "sched-ext-6.12"
    monkeypatch.setenv("HARMONY_KERNEL_SEED", str(tmp_path))
    assert kernels.seed_dir("sched-ext") == tmp_path / "sched-ext-6.12"
    (tmp_path / "config.gz").write_bytes(b"")
    assert kernels.seed_dir("sched-ext") == tmp_path


def _fake_source(monkeypatch, rec: dict, seed: Path | None, version: str | None) -> None:
    """The recipe ``rec``, a reference build at ``seed``, apt offering the source ``version``
    (None: apt knows none)."""
    def source_version(r):
        if version is None:
            raise kernels.KernelError("apt knows no package linux-source-6.12")
        return version
    monkeypatch.setattr(kernels, "recipe", lambda name: rec)
    monkeypatch.setattr(kernels, "source_version", source_version)
    monkeypatch.setattr(kernels, "seed_dir", lambda name: seed or Path("/nonexistent"))


def _cached_build(cache: Path, rec: dict, version: str, vng: str | None = None) -> Path:
    """A build of ``rec`` of ``version`` in ``cache``, laid out and recorded as build() does."""
    key = kernels.build_key(rec, version, vng)
    d = kernels.built_dir("sched-ext", key, cache)
    d.mkdir(parents=True)
    _bzimage(d / "bzImage", kernels.upstream_release(version))
    src = {"kind": "build", "recipe": "sched-ext", "package": rec["source_package"],
           "version": version, "key": key, "virtme_ng": vng or kernels.vng_version(),
           "schedulers": rec["schedulers"], "from": "build"}
    (d / kernels.RECORD).write_text(json.dumps({"spec": "sched-ext", "image": "bzImage",
                                                "release": kernels.upstream_release(version),
                                                "moddir": None, "source": src}))
    return d


def test_a_moved_on_source_uses_the_reference_build_and_says_which(tmp_path, monkeypatch):
    """apt offers 6.12.118, the reference build is 6.12.117 (whose config the recipe knows): it
    is used, its version said in a note the manifest keeps (the kernel's source); nothing is
    built, the recipe is not edited."""
    seed, rec = _seed(tmp_path, b"CONFIG_SCHED_CLASS_EXT=y\n")
    _fake_source(monkeypatch, rec, seed, "6.12.118-1~deb12u1")
    said = []
    k = kernels.available("sched-ext", tmp_path / "cache", said.append)
    assert k.release == "6.12.117" and k.source["version"] == "6.12.117-1~deb12u1"
    assert k.source["from"] == "seed" and k.source["current_version"] == "6.12.118-1~deb12u1"
    assert k.source["note"] == (
        "kernel sched-ext: using its build of linux-source-6.12 6.12.117-1~deb12u1 (seeded from "
        f"{seed}); the source is now 6.12.118-1~deb12u1: `harmony kernel build sched-ext` "
        "builds that")
    assert k.to_dict()["source"]["note"] == k.source["note"]          # the manifest's vm.kernel
    assert said == [f"seeding the kernel cache with the reference build {seed} "
                    "(6.12.117-1~deb12u1)"]
    # next time from the cache, saying the same; kernel list says which and what builds more
    assert kernels.available("sched-ext", tmp_path / "cache").source["note"] == k.source["note"]
    line = kernels.status("sched-ext", tmp_path / "cache")
    assert line.startswith(f"seeded from {seed} (linux-source-6.12 6.12.117-1~deb12u1)")
    assert line.endswith("the source is now 6.12.118-1~deb12u1: `harmony kernel build "
                         "sched-ext` builds that")


def test_the_newest_build_of_the_recipe_is_used(tmp_path, monkeypatch):
    seed, rec = _seed(tmp_path, b"CONFIG_SCHED_CLASS_EXT=y\n")
    cache = tmp_path / "cache"
    _fake_source(monkeypatch, rec, seed, "6.12.119-1~deb12u1")
    # a build of 6.12.116 is older than the reference build: the reference is used
    _cached_build(cache, rec, "6.12.116-1~deb12u1")
    assert kernels.available("sched-ext", cache).source["version"] == "6.12.117-1~deb12u1"
    # a build of 6.12.118 (made here before the source moved on again) is newer than both
    _cached_build(cache, rec, "6.12.118-1~deb12u1")
    k = kernels.available("sched-ext", cache)
    assert k.source["version"] == "6.12.118-1~deb12u1" and k.source["from"] == "build"
    assert "6.12.119-1~deb12u1" in k.source["note"]
    # a build of an older recipe (other options) is not a build of this one, however new
    other = {**rec, "configitems": rec["configitems"] + ["CONFIG_PREEMPT=y"]}
    _cached_build(cache, other, "6.12.120-1~deb12u1")
    assert kernels.available("sched-ext", cache).source["version"] == "6.12.118-1~deb12u1"
    # the source's own build, once built (`harmony kernel build`), is used without a note
    _cached_build(cache, rec, "6.12.119-1~deb12u1")
    k = kernels.available("sched-ext", cache)
    assert k.source["version"] == "6.12.119-1~deb12u1" and "note" not in k.source


def test_no_build_of_the_recipe_names_the_command(tmp_path, monkeypatch):
    seed, rec = _seed(tmp_path, b"CONFIG_SCHED_CLASS_EXT=y\n")
    (seed / "config.gz").write_bytes(gzip.compress(b"someone else's config\n"))
    _fake_source(monkeypatch, rec, seed, "6.12.118-1~deb12u1")
    with pytest.raises(kernels.KernelError, match=r"kernel sched-ext is not built "
                       r"\(linux-source-6.12 6.12.118-1~deb12u1; no reference build: .* is not "
                       r"the config the recipe makes of 6.12.117-1~deb12u1\): `harmony kernel "
                       r"build sched-ext` builds it"):
        kernels.available("sched-ext", tmp_path / "cache")
    # no reference build where one is looked for: the error says where, and the variable
    _fake_source(monkeypatch, rec, tmp_path / "elsewhere" / "sched-ext-6.12",
                 "6.12.118-1~deb12u1")
    with pytest.raises(kernels.KernelError, match=r"no reference build: none in "
                       r"shared/kernels/sched-ext-6.12 above Harmony's directory or the current "
                       r"one \(HARMONY_KERNEL_SEED names one elsewhere\)\): `harmony kernel"):
        kernels.available("sched-ext", tmp_path / "cache")
    # apt unreachable: the newest cached build still serves
    _fake_source(monkeypatch, rec, seed, None)
    _cached_build(tmp_path / "cache", rec, "6.12.110-1~deb12u1")
    k = kernels.available("sched-ext", tmp_path / "cache")
    assert k.source["version"] == "6.12.110-1~deb12u1" and "note" not in k.source


def test_debian_versions_sort_as_dpkg_does():
    """The order of source versions against dpkg's own (an independent reading)."""
    import functools
    import shutil

    if shutil.which("dpkg") is None:
        from conftest import host_skip
        host_skip("no dpkg to compare Debian versions with")

    def dpkg(a: str, b: str) -> int:
        lt = subprocess.run(["dpkg", "--compare-versions", a, "lt", b]).returncode == 0
        return -1 if lt else 0 if a == b else 1

    versions = ["6.12.117-1~deb12u1", "6.12.9-1", "6.12.117-1", "6.12.118-1~deb12u1",
                "6.12.117-2~deb12u1", "6.12.117-1~deb12u2", "6.1.0-1"]
    assert sorted(versions, key=kernels.version_order) == sorted(
        versions, key=functools.cmp_to_key(dpkg))


def test_a_failing_configuration_names_the_option(tmp_path):
    kernels._check_config("CONFIG_A=y\n# CONFIG_B is not set\n", ["CONFIG_A=y", "CONFIG_B=n"])
    with pytest.raises(kernels.KernelError, match="does not have CONFIG_C=y"):
        kernels._check_config("CONFIG_A=y\n", ["CONFIG_A=y", "CONFIG_C=y"])


def test_what_a_kernel_recipe_turns_off_is_known_before_it_is_built():
    assert scx_build.recipe_lacks(kernels.recipe("sched-ext")["configitems"]) == [
        "CONFIG_FUNCTION_TRACER=y"]
    assert scx_build.recipe_lacks(kernels.recipe("sched-ext-full")["configitems"]) == []
    assert scx_build.recipe_lacks(["CONFIG_CPU_FREQ=n", "CONFIG_FUNCTION_TRACER=y"]) == [
        "CONFIG_CPU_FREQ=y"]


# --- the command line ---------------------------------------------------------------------------

def _cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(HARMONY + list(args), capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args, code, match", [
    (["--scx", "fast", "--kernel", "sched-ext"], 2,
     "unknown scheduler 'fast': give one of simple, central, qmap, flatcg, bpfland, rusty, lavd"),
    (["--scx", "simple", "--kernel", "debian:6.12"], 2, "kernel debian:6.12 has no sched_ext"),
    # built (or seeded), the kernel's config says both; before, its recipe says the first
    (["--scx", "lavd", "--kernel", "sched-ext"], 2,
     "scheduler lavd needs CONFIG_FUNCTION_TRACER=y"),
    (["--scx", "simple", "--kernel", "sched-ext", "-p", "policy=fifo", "-p", "rt_priority=5"],
     2, "policy=fifo under --scx"),
    (["--scx-args", "-v"], 2, "--scx-args goes with --scx NAME"),
])
def test_bad_input_is_one_line_before_anything_starts(tmp_path, args, code, match):
    out = tmp_path / "r"
    p = _cli("run", "single-source", "--duration", "1", "--out", str(out), *args)
    assert p.returncode == code, p.stderr
    assert match in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()


def test_a_host_kernel_without_sched_ext_is_refused(tmp_path, monkeypatch):
    """The command line's refusal, on any host: the kernel's sched_ext directory is a path that
    is not there (on a host without sched_ext, the real one is not either)."""
    from click.testing import CliRunner

    from harmony.cli import main

    absent = tmp_path / "sched_ext"
    monkeypatch.setattr(scx, "SCHED_EXT_DIR", absent)
    r = CliRunner().invoke(main, ["run", "single-source", "--scx", "simple", "--out",
                                  str(tmp_path / "r")])
    assert r.exit_code == 1 and f"has no sched_ext ({absent} absent)" in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_kernel_list_says_how_to_build_sched_ext(tmp_path):
    p = _cli("kernel", "list", env={"HARMONY_KERNEL_CACHE": str(tmp_path / "cache"),
                                    "HARMONY_KERNEL_SEED": str(tmp_path / "no-seed")})
    assert p.returncode == 0, p.stderr
    assert "sched-ext" in p.stdout
    assert "`harmony kernel build sched-ext` builds it" in p.stdout or "not built (" in p.stdout
    p = _cli("kernel", "build", "sched-ext2")
    assert p.returncode == 2 and "unknown kernel to build 'sched-ext2'" in p.stderr


def test_a_build_step_says_where_it_is_and_fails_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "BUILD_SAY_EVERY_S", 0.0)
    said = []
    with open(tmp_path / "build.log", "w") as log:
        kernels.build_step(["sh", "-c", "echo CC a.o; echo LD vmlinux"], tmp_path, log,
                           said.append, "make")
        with pytest.raises(kernels.KernelError) as err:
            kernels.build_step(["sh", "-c", "echo CC b.o; echo 'b.c:1: error: no' >&2; "
                                "exit 2"], tmp_path, log, said.append, "make")
    assert str(err.value) == "make failed (exit 2): CC b.o | b.c:1: error: no"
    assert any("make:" in line and "LD vmlinux" in line for line in said)
    assert "$ sh -c echo CC a.o" in (tmp_path / "build.log").read_text()


def test_a_build_without_its_packages_as_a_user_says_which(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "missing_packages", lambda packages: ["clang-19", "dwarves"])
    monkeypatch.setattr(kernels.os, "geteuid", lambda: 1000)
    with pytest.raises(kernels.KernelError, match="needs these Debian packages: clang-19 dwarves"):
        kernels.build("sched-ext", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_the_scheduler_goes_with_a_planned_run(tmp_path):
    from harmony.experiments import get_experiment
    from harmony.vm.guest import PlannedRun, read_job, write_job

    exp = get_experiment("single-source")
    cpus = [0, 1, 2, 3]
    params = exp.resolve({"duration": "1", "layout": "8,0,0,0"}, cpus)
    spec = scx.resolve("simple", "-v", _build_dir(tmp_path))
    write_job(tmp_path / "job.json", [PlannedRun.of(exp, params, cpus, tmp_path / "r", "tracefs",
                                                    0, spec)])
    (run,) = read_job(tmp_path / "job.json")
    assert scx.ScxSpec.from_dict(run.scx) == spec


def test_a_scheduler_still_unloading_is_waited_for(tmp_path):
    root = _root(tmp_path, "disabling")
    # renamed into place: `>` empties the file before echo fills it, and start() reading it in
    # between would see neither "disabling" nor "disabled" (the kernel's file has no such moment)
    subprocess.Popen(["sh", "-c", f"sleep 0.3; echo disabled > {root}/state.tmp && "
                      f"mv {root}/state.tmp {root}/state"])
    s = scx.Scheduler(scx.ScxSpec("fake", str(_scheduler(tmp_path, root))),
                      tmp_path / "scx.log", root=root)
    s.start()
    assert s.stop()["enabled_throughout"]


def _gone(pid: int) -> bool:
    try:
        return ") Z" in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True


def test_the_scheduler_dies_with_its_controller(tmp_path):
    """kill -9 of the process that started the scheduler: the kernel kills the scheduler
    (setpriv --pdeathsig KILL), so a BPF scheduler is never left loaded by a dead controller."""
    from conftest import until

    root = _root(tmp_path)
    fake = _scheduler(tmp_path, root)
    code = ("import sys, time; from pathlib import Path; from harmony.vm import scx; "
            f"s = scx.Scheduler(scx.ScxSpec('fake', {str(fake)!r}), Path({str(tmp_path)!r}) / "
            f"'scx.log', root=Path({str(root)!r})); s.start(); print(s.proc.pid, flush=True); "
            "time.sleep(60)")
    controller = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(controller.stdout.readline())
    assert scx.proc_starttime(pid) is not None
    controller.kill()
    controller.wait()
    assert until(lambda: _gone(pid), 10.0)
    osutil.record_path("scx", controller.pid).unlink(missing_ok=True)


def test_with_a_kernel_image_the_schedulers_are_beside_it(tmp_path):
    _bzimage(tmp_path / "bzImage", "6.12.117")
    out = tmp_path / "r"
    p = _cli("run", "single-source", "--kernel", str(tmp_path / "bzImage"), "--scx", "qmap",
             "--out", str(out))
    assert p.returncode == 2, p.stderr
    assert f"scheduler qmap: {tmp_path / 'scx_qmap'} is missing from the kernel build" in p.stderr
    assert not out.exists()


# --- the scx project's Rust schedulers: harmony scx build -------------------------------------

def _fake_cargo(tmp_path: Path, rustc: str = "1.95.0", fail: bool = False) -> Path:
    """A cargo that "installs" a crate as a script, and its rustc; each call appended to calls."""
    bindir = tmp_path / "toolchain"
    bindir.mkdir(exist_ok=True)
    _exe(bindir / "rustc", f"#!/bin/sh\necho 'rustc {rustc} (59807616e 2026-04-14)'\n")
    body = ("echo 'error: could not compile scx_utils' >&2; exit 101" if fail else
            'mkdir -p "$root/bin" && printf "#!/bin/sh\\necho %s\\n" "$crate" > "$root/bin/$crate"'
            ' && chmod +x "$root/bin/$crate"')
    return _exe(bindir / "cargo", f"""#!/bin/sh
echo "$@ BPF_CLANG=$BPF_CLANG TARGET=$CARGO_TARGET_DIR" >> {tmp_path}/calls
while [ $# -gt 0 ]; do
  case "$1" in --root) root=$2; shift;; --version|--jobs) shift;; install|--locked) ;; \
*) crate=$1;; esac
  shift
done
echo "   Compiling $crate"
{body}
""")


@pytest.fixture
def rust_cache(tmp_path, monkeypatch):
    """The Rust schedulers' cache in tmp_path, packages taken as installed."""
    monkeypatch.setattr(scx_build, "install_packages", lambda *a: None)
    return tmp_path / "scx-cache"


def test_a_rust_scheduler_is_built_once_and_found_by_name(tmp_path, monkeypatch, rust_cache):
    cargo = _fake_cargo(tmp_path)
    monkeypatch.setattr(scx_build, "cargo", lambda: str(cargo))
    said = []
    got = scx_build.build(["rusty", "scx_bpfland"], cache=rust_cache, progress=said.append,
                          jobs=2)
    assert sorted(got) == ["bpfland", "rusty"]
    assert subprocess.run([got["rusty"]], capture_output=True, text=True).stdout == "scx_rusty\n"
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 2 and "install --locked --jobs 2 --root" in calls[0]
    assert "--version 1.1.4 scx_rusty" in calls[0]
    # one target directory for both: their dependencies are compiled once
    assert all(f"BPF_CLANG=clang-19 TARGET={rust_cache / '.target'}" in c for c in calls)
    rec = json.loads((got["rusty"].parent / "build.json").read_text())
    assert rec["crate"] == "scx_rusty" and rec["rustc"] == "1.95.0" and rec["build_s"] >= 0
    assert scx_build.built("rusty", rust_cache) == got["rusty"]
    assert scx_build.built("lavd", rust_cache) is None
    assert "built here" in scx_build.status("rusty", rust_cache)
    # built already: not again
    scx_build.build(["rusty"], cache=rust_cache, progress=said.append)
    assert len((tmp_path / "calls").read_text().splitlines()) == 2
    assert "is built already" in said[-1]
    # --scx rusty finds it; a Rust scheduler not built says the command that builds it
    monkeypatch.setattr(scx_build, "CACHE", rust_cache)
    spec = scx.resolve("rusty", "--slice-us 5000")
    assert spec == scx.ScxSpec("rusty", str(got["rusty"]), ("--slice-us", "5000"))
    with pytest.raises(UnknownScheduler, match=r"^scheduler lavd is not built: `harmony scx "
                                               r"build lavd` builds it"):
        scx.resolve("lavd")
    # a new compiler is a new configuration
    monkeypatch.setattr(scx_build, "cargo", lambda: str(_fake_cargo(tmp_path, "1.96.0")))
    assert scx_build.built("rusty", rust_cache) is None


def test_a_failed_rust_build_is_one_line_and_leaves_nothing_half_built(tmp_path, monkeypatch,
                                                                       rust_cache):
    monkeypatch.setattr(scx_build, "cargo", lambda: str(_fake_cargo(tmp_path, fail=True)))
    with pytest.raises(ScxError, match=r"^scx_lavd failed \(exit 101\): Compiling scx_lavd \| "
                                       r"error: could not compile scx_utils \(log: .*"
                                       r"scx_lavd-build-failed\.log\)$"):
        scx_build.build(["lavd"], cache=rust_cache)
    assert sorted(p.name for p in rust_cache.iterdir()) == [".lock", "scx_lavd-build-failed.log"]


def test_rust_build_refuses_without_cargo_or_with_an_old_rust(tmp_path, monkeypatch, rust_cache):
    monkeypatch.setattr(scx_build, "cargo", lambda: None)
    with pytest.raises(ScxError, match=r"needs cargo \(Rust >= 1\.91"):
        scx_build.build(["rusty"], cache=rust_cache)
    monkeypatch.setattr(scx_build, "cargo", lambda: str(_fake_cargo(tmp_path, "1.80.1")))
    with pytest.raises(ScxError, match=r"need Rust >= 1\.91; this machine has 1\.80\.1"):
        scx_build.build(["rusty"], cache=rust_cache)
    with pytest.raises(UnknownScheduler, match="unknown Rust scheduler 'fast': give one of "
                                               "bpfland, rusty, lavd"):
        scx_build.build(["fast"], cache=rust_cache)


def test_what_the_rust_schedulers_need_of_a_kernel():
    assert scx_build.kernel_lacks("CONFIG_BPF=y\n# CONFIG_FUNCTION_TRACER is not set\n") == [
        "CONFIG_FUNCTION_TRACER=y", "CONFIG_CPU_FREQ=y"]
    assert scx_build.kernel_lacks("CONFIG_FUNCTION_TRACER=y\nCONFIG_CPU_FREQ=y\n") == []


def test_a_wait_for_the_kernel_cache_is_said_before_it_waits(tmp_path, capfd):
    """Another build holds the cache (up to half an hour): the one that waits says so first,
    through its progress or, without one, on standard error; it takes the lock once freed."""
    import fcntl
    import threading

    holder = kernels.cache_lock(tmp_path)         # free: taken at once, nothing said
    assert capfd.readouterr().err == ""
    said, got = [], []
    t = threading.Thread(target=lambda: got.append(kernels.cache_lock(tmp_path, said.append)))
    t.start()
    for _ in range(500):
        if said:
            break
        time.sleep(0.01)
    assert said == [f"waiting for the kernel cache {tmp_path}: another build or seeding "
                    "holds it"] and not got
    os.close(holder)
    t.join(10)
    assert got
    holder = got[0]
    t = threading.Thread(target=lambda: got.append(kernels.cache_lock(tmp_path)))
    t.start()
    for _ in range(500):
        if "waiting for the kernel cache" in capfd.readouterr().err:
            break
        time.sleep(0.01)
    else:
        pytest.fail("the wait was silent")
    fcntl.flock(holder, fcntl.LOCK_UN)
    os.close(holder)
    t.join(10)
    os.close(got[1])
