"""The VM runner's boot, job channel and end, hermetically: virtme-ng stands in as a script that
runs the guest's command on this host (with a stand-in QEMU in its tree and a daemon that leaves
its session, as virtiofsd does), and the guest agent is the real one (its job loop, lines and
errors) with its captures and facts replaced. Tested: several flushes in one boot, a guest agent
that fails saying why on the host, and a controller killed at any moment leaving nothing running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import until
from test_vm import KERNEL, _lock_dir_in

from harmony import store
from harmony.core.errors import VmError
from harmony.experiments import get_experiment
from harmony.vm import machine as vm
from harmony.core.osutil import harmony_python as real_harmony_python
from harmony.vm import runner as vm_runner

FAKE_VNG = '''#!{python}
"""virtme-ng standing in: runs the command after "--" here, in its own tree."""
import os, subprocess, sys
d = os.path.dirname(os.path.abspath(__file__))
if "--run" not in sys.argv:     # vng --version
    sys.exit(print("virtme-ng 0.0-stand-in"))
with open(os.path.join(d, "vng.pids"), "a") as f:
    f.write(f"{{os.getpid()}}\\n")
qemu = subprocess.Popen([os.path.join(d, "qemu-system-x86_64"), "600"])
if os.fork() == 0:            # a daemon that leaves the session and is orphaned (virtiofsd)
    os.setsid()
    if os.fork() == 0:
        os.execv(os.path.join(d, "virtiofsd"), ["virtiofsd", "600"])
    os._exit(0)
os.wait()
rc = subprocess.call(["sh", "-c", sys.argv[sys.argv.index("--") + 1]])
if rc:
    print(f"virtme-ng-init: script exited with code {{rc}}", flush=True)
qemu.kill()
sys.exit(rc)
'''

FAKE_AGENT = '''
import contextlib, os, sys, time
mode = os.environ.get("FAKE_AGENT", "ok")
if mode == "import-fails":
    raise ModuleNotFoundError("No module named 'harmony.analysis' (on purpose)")
from harmony.vm import guest

def facts():
    if mode == "facts-fail":
        raise RuntimeError("tracefs cannot be mounted here (on purpose)")
    if mode == "slow-boot":
        time.sleep(600)
    return {"kernel": "6.12.0-fake", "scheduler": "EEVDF", "ncpus": 2}

def capture(planned, params, cpus, out, *args, pause=None, resume=None, **kwargs):
    pause()
    if mode == "dies":          # the guest gone mid-run (a panic, QEMU killed): no last word
        os._exit(9)
    if mode == "vm-killed":     # the VM ended from outside (QEMU killed): no init line either
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(here, "vng.pids")) as f:
            os.kill(int(f.read().split()[-1]), 9)
        time.sleep(600)         # the reaper ends what the stand-in virtme-ng left
    if mode == "slow-capture":
        time.sleep(600)
    if mode == "captured":
        return _captured(out, resume)
    resume()
    raise RuntimeError(f"fake capture by agent {os.getpid()}")

made = []

def _stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()

def _analysers():
    """The state letter of each background analyser of the runner that started this stand-in
    VM (a child of one of this process's ancestors), read from /proc."""
    import glob
    ancestors, pid = set(), os.getppid()
    while pid > 1:
        ancestors.add(pid)
        pid = int(_stat(pid)[1])
    out = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as f:
                argv = f.read().split(b"\\0")
            st = _stat(cmdline.split("/")[2])
            if b"harmony.analyser" in argv and int(st[1]) in ancestors:
                out.append(st[0])
        except OSError:
            pass
    return out

def _captured(out, resume):
    """A capture of nothing, said captured: what the host's analyser was doing in its window
    (read here, until it is seen stopped), and whether the host had landed the run before."""
    import glob, json, types
    start, seen = time.monotonic(), []
    while not (seen and set(seen) == {"T"}) and time.monotonic() < start + (20 if seen else 2):
        seen = _analysers()         # none within 2 s: the host has none
        time.sleep(0.01)
    landed = None
    if made:
        give_up = time.monotonic() + 20
        while time.monotonic() < give_up and landed is None:
            try:        # none until the host has unpacked the run this agent handed over
                with open(os.path.join(made[-1], "manifest.json")) as f:
                    landed = json.load(f).get("vm")
            except FileNotFoundError:
                pass
            time.sleep(0.01)
    resume()
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"status": "captured", "experiment": "single-source", "params": {},
                   "analysers_in_window": seen, "previous_landed": landed is not None}, f)
    # made in the guest's memory (harmony.run.Staged), its probe's data files links to the run's
    link = glob.glob(os.path.join(out, "raw", "*", "*"))[0]
    made.append(os.path.dirname(os.path.dirname(os.path.dirname(os.readlink(link)))))
    return types.SimpleNamespace(manifest={"params": {}})

guest.guest_facts, guest.capture, guest.HostLock = facts, capture, contextlib.nullcontext
guest.topology_problem = lambda topology, facts: None       # the shape asked for: got
# the input port is the fake virtme-ng's standard input (none: a guest without virtio_console)
guest.job_input = (lambda: None) if mode == "no-more" else (lambda: sys.stdin)
sys.exit(guest.main(sys.argv[1:]))
'''


def setup_fake_vm(tmp_path: Path, monkeypatch) -> Path:
    """virtme-ng and the guest agent standing in (see the module); the VM's records in
    ``tmp_path``; the host lock not taken (the runner's own is tested with real runs)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "vng").write_text(FAKE_VNG.format(python=sys.executable))
    (bin_dir / "vng").chmod(0o755)
    for name in ("qemu-system-x86_64", "virtiofsd"):
        if not (bin_dir / name).exists():
            (bin_dir / name).symlink_to("/bin/sleep")
    (bin_dir / "agent.py").write_text(FAKE_AGENT)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    _lock_dir_in(tmp_path, monkeypatch)
    monkeypatch.setattr(vm_runner, "HostLock", _NoLock)
    monkeypatch.setattr(vm_runner, "reclaim_stale", lambda: [])

    def agent(module, *args, env=None, site=True):
        assert module == "harmony.vm.agent" and not site     # no site directory: python -S
        # the environment the real agent gets: this Harmony on its path, wherever it lives
        return ([sys.executable, "-S", "-P", str(bin_dir / "agent.py"), *args],
                real_harmony_python(module, env=env, site=site)[1])
    monkeypatch.setattr(vm_runner, "harmony_python", agent)
    # the bundle would be copied to this host's /tmp, the guest's own in a VM: tested apart
    # (tests/test_vm_bundle.py); the stand-in agent imports from the tree
    monkeypatch.setattr(vm_runner, "write_bundle", lambda job_dir: None)
    return bin_dir


@pytest.fixture
def fake_vm(tmp_path, monkeypatch):
    return setup_fake_vm(tmp_path, monkeypatch)


class _NoLock:
    def acquire(self):
        return self

    def release(self):
        pass


def tree(bin_dir: Path) -> list[str]:
    """The processes of a fake VM still running (not zombies): the reaper, virtme-ng, the
    stand-in QEMU and daemon, the agent."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        mine = str(bin_dir) in cmd or ("reaper.py" in cmd and str(bin_dir.parent) in cmd)
        if state not in "ZX" and mine and entry.name != str(os.getpid()):
            out.append(f"{entry.name}: {cmd[:120]}")
    return out


def _runner(tmp_path) -> vm_runner.VmRunner:
    return vm_runner.VmRunner(KERNEL, 2, setting=vm.QemuSetting(accel="tcg"))


def _plan(r: vm_runner.VmRunner, out: Path, seed: int = 0) -> None:
    exp = get_experiment("single-source")
    params = exp.resolve({"duration": "1"}, [0, 1])
    r.capture(exp, params, [0, 1], out, seed, figures=False)


def test_several_flushes_are_made_in_one_boot_that_ends_with_the_runner(fake_vm, tmp_path):
    """Three runs in two flushes: one virtme-ng, one agent (the same pid made every capture),
    a job a flush; each flush returns with its runs landed (here incomplete: the stand-in
    capture fails, saying so); leaving the runner ends the VM, and nothing is left running."""
    with _runner(tmp_path) as r:
        _plan(r, tmp_path / "a")
        r.flush()
        first = store.read_json(tmp_path / "a" / "manifest.json")
        assert first["status"] == "incomplete"
        assert r.vm.running, "the VM ends with the runner, not with a flush"
        _plan(r, tmp_path / "b")
        _plan(r, tmp_path / "c", seed=1)
        r.flush()
        assert r.jobs == 2 and r.more
    reasons = {d: store.read_json(tmp_path / d / "manifest.json")["incomplete_reason"]
               for d in "abc"}
    pid = reasons["a"].split()[-1]
    assert all(why == f"RuntimeError: fake capture by agent {pid}" for why in reasons.values())
    assert len((fake_vm / "vng.pids").read_text().split()) == 1
    assert until(lambda: not tree(fake_vm), 5), tree(fake_vm)
    assert not list(tmp_path.glob("vm-*.json"))             # the record went with the VM
    console = (tmp_path / "a" / "vm-console.log").read_text()     # with the first flush's runs
    assert console.count('"event": "facts"') == 1 and console.count('"event": "flushed"') == 2
    assert '"event": "end"' in console                      # the agent ended at its input's end


def test_runs_are_landed_as_written_and_analysed_between_windows(fake_vm, tmp_path,
                                                                  monkeypatch):
    """Each run is landed as the guest says it is written (the guest sees the host's manifest
    of its previous run before its next window ends), and the host's background analyser is
    stopped in every window (the guest reads its state in /proc: T) and analyses the runs: each
    is reported once (an error here: the stand-in captures hold no trace)."""
    monkeypatch.setenv("FAKE_AGENT", "captured")
    with _runner(tmp_path) as r:
        for d in "abc":
            _plan(r, tmp_path / d)
        r.flush()
        analyser = r.worker.pid
        assert r.worker is not None and r.analysis.startswith("on the host between")
    assert r.worker is None and not Path(f"/proc/{analyser}").exists()
    for k, d in enumerate("abc"):
        m = store.read_json(tmp_path / d / "manifest.json")
        assert m["analysers_in_window"] == ["T"], m     # one analyser, stopped in the window
        assert m["previous_landed"] == (k > 0)
        assert m["vm"]["land_s"] is not None and m["vm"]["accelerator"] == "tcg"
    assert sorted(res["path"] for res in r.results) == [str(tmp_path / d) for d in "abc"]
    assert all(res["status"] == "error" for res in r.results), r.results


def test_each_drain_tells_its_own_runs_and_the_analyser_comes_back(fake_vm, tmp_path,
                                                                    monkeypatch):
    """Flushed and drained in rounds in one boot (as --until-decided does): each drain reports
    the runs of its round once, and the next round has an analyser again, stopped in its
    windows."""
    monkeypatch.setenv("FAKE_AGENT", "captured")
    with _runner(tmp_path) as r:
        _plan(r, tmp_path / "a")
        r.flush()
        assert [res["path"] for res in r.drain()] == [str(tmp_path / "a")]
        assert r.worker is None
        _plan(r, tmp_path / "b")
        _plan(r, tmp_path / "c", seed=1)
        r.flush()
        assert r.jobs == 2 and r.worker is not None
        assert sorted(res["path"] for res in r.drain()) == [str(tmp_path / d) for d in "bc"]
    assert r.results == []
    for d in "bc":
        assert store.read_json(tmp_path / d / "manifest.json")["analysers_in_window"] == ["T"]


def test_without_overlap_the_runs_are_analysed_after_the_vm(fake_vm, tmp_path, monkeypatch):
    """``overlap`` False (`harmony suite --overlap never`): no analyser runs beside the guest;
    every run is analysed once, after the VM."""
    monkeypatch.setenv("FAKE_AGENT", "captured")
    r = vm_runner.VmRunner(KERNEL, 2, setting=vm.QemuSetting(accel="tcg"), overlap=False)
    assert r.analysis.startswith("on the host after the VM exits")
    with r:
        for d in "ab":
            _plan(r, tmp_path / d)
        r.flush()
        assert r.worker is None
    for d in "ab":
        assert store.read_json(tmp_path / d / "manifest.json")["analysers_in_window"] == []
    assert sorted(res["path"] for res in r.results) == [str(tmp_path / d) for d in "ab"]


def test_a_guest_without_the_input_port_boots_again_for_each_flush(fake_vm, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv("FAKE_AGENT", "no-more")
    with _runner(tmp_path) as r:
        _plan(r, tmp_path / "a")
        r.flush()
        assert not r.more
        _plan(r, tmp_path / "b")
        r.flush()
    assert len((fake_vm / "vng.pids").read_text().split()) == 2
    for d in "ab":
        assert "fake capture by agent" in store.read_json(tmp_path / d / "manifest.json")[
            "incomplete_reason"]
    assert until(lambda: not tree(fake_vm), 5), tree(fake_vm)


def test_a_flush_outside_the_boots_directory_boots_again(fake_vm, tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    with _runner(tmp_path) as r:
        _plan(r, tmp_path / "one" / "a")
        r.flush()
        _plan(r, tmp_path / "two" / "b")
        r.flush()
    assert len((fake_vm / "vng.pids").read_text().split()) == 2
    assert until(lambda: not tree(fake_vm), 5), tree(fake_vm)


@pytest.mark.parametrize("mode, says", [
    ("facts-fail", "the guest agent stopped before the end of its runs: RuntimeError: tracefs "
                   "cannot be mounted here (on purpose)"),
    ("import-fails", "the VM ended (exit 1) before the guest agent started; the guest said: "
                     "ModuleNotFoundError: No module named 'harmony.analysis' (on purpose)"),
])
def test_a_guest_agent_that_fails_says_why_on_the_host(fake_vm, tmp_path, monkeypatch, mode,
                                                       says):
    """The agent's own error (its message; where it died before speaking, its traceback's last
    line) is in the one-line error, not virtme-ng's "script exited with code 1"; the run is
    incomplete saying the same."""
    monkeypatch.setenv("FAKE_AGENT", mode)
    with pytest.raises(VmError) as exc:
        with _runner(tmp_path) as r:
            _plan(r, tmp_path / "a")
            r.flush()
    msg = str(exc.value)
    assert msg.startswith("kernel debian:6.1: ") and says in msg and "\n" not in msg, msg
    m = store.read_json(tmp_path / "a" / "manifest.json")
    assert m["status"] == "incomplete" and says in m["incomplete_reason"]
    # the VM's facts known on the host are kept, its death said as such; the guest said no
    # facts (neither agent got that far): the kernel under test is the one asked for, said so
    assert m["vm"]["kernel"]["spec"] == "debian:6.1" and m["vm"]["vcpus"] == 2
    assert m["vm"]["accelerator"] == "tcg" and says in m["vm"]["died"]["why"]
    assert m["vm"]["died"]["booted"] is False and m["vm"]["died"]["exit_status"] == 1
    assert m["under_test"]["kernel"] == KERNEL.release and "asked" in m["under_test"][
        "facts_from"]
    assert until(lambda: not tree(fake_vm), 5), tree(fake_vm)


def test_a_vm_killed_mid_run_is_said_to_be_so(fake_vm, tmp_path, monkeypatch):
    """The VM ended from outside inside a run (virtme-ng's tree killed, as QEMU is when killed:
    no word from the guest, no power-off on its console): the one-line error says QEMU died or
    was killed; a guest whose command ended by itself (the agent gone, virtme-ng's init saying
    so) is not said to be."""
    monkeypatch.setenv("FAKE_AGENT", "vm-killed")
    with pytest.raises(VmError) as exc:
        with vm_runner.VmRunner(KERNEL, 2, setting=vm.QemuSetting(accel="tcg")) as r:
            _plan(r, tmp_path / "a")
            r.flush()
    text = str(exc.value)
    assert "\n" not in text and text.startswith("kernel debian:6.1: QEMU died or was killed "
                                                "before the end of its runs"), text
    assert store.read_json(tmp_path / "a" / "manifest.json")["vm"]["died"]["why"] == text
    monkeypatch.setenv("FAKE_AGENT", "dies")
    with pytest.raises(VmError) as exc:
        with vm_runner.VmRunner(KERNEL, 2, setting=vm.QemuSetting(accel="tcg")) as r:
            _plan(r, tmp_path / "b")
            r.flush()
    assert "QEMU" not in str(exc.value) and "the guest agent stopped" in str(exc.value)
    assert until(lambda: not tree(fake_vm), 5), tree(fake_vm)


def test_a_vm_that_dies_mid_run_keeps_its_facts_in_the_manifest(fake_vm, tmp_path, monkeypatch):
    """The guest dies inside a run's measured window (the agent gone without a word, as in a
    panic or QEMU killed): the run is incomplete, and its manifest keeps what the host knew of
    the VM before -- the kernel asked for, the vCPUs and topology, QEMU's version, the
    accelerator -- and the guest's facts, with the death recorded as such; the report says
    it, not "(?, )"."""
    from harmony.analysis.report import vm_lines
    from harmony.vm.topology import parse

    monkeypatch.setenv("FAKE_AGENT", "dies")
    topo = parse("2socket")
    with pytest.raises(VmError) as exc:
        with vm_runner.VmRunner(KERNEL, 2, setting=vm.QemuSetting(accel="tcg"),
                                topology=topo) as r:
            _plan(r, tmp_path / "a")
            r.flush()
    assert "\n" not in str(exc.value) and str(exc.value).startswith("kernel debian:6.1: ")
    m = store.read_json(tmp_path / "a" / "manifest.json")
    assert m["status"] == "incomplete"
    v = m["vm"]
    assert v["kernel"]["spec"] == "debian:6.1" and v["kernel"]["release"] == KERNEL.release
    assert v["vcpus"] == topo.vcpus == 4 and v["accelerator"] == "tcg"
    assert v["topology"]["describe"] == topo.describe() and v["topology"]["smp"] == topo.smp()
    # the stand-in QEMU's own answer to --version (a symlink to sleep), read here independently
    said = subprocess.run([fake_vm / "qemu-system-x86_64", "--version"], capture_output=True,
                          text=True).stdout.splitlines()[0].strip()
    assert v["qemu"] == said and v["virtme_ng"] == "0.0-stand-in"
    assert v["died"]["booted"] and v["died"]["exit_status"] == 9, v["died"]
    assert v["died"]["why"] == str(exc.value)
    assert v["window_host_s"] is None           # the window never ended
    assert m["under_test"]["kernel"] == "6.12.0-fake"   # the guest's facts, said before
    lines = vm_lines(m)
    assert lines[0].startswith("kernel under test            debian:6.1 (p v)"), lines
    assert lines[1].startswith("VM                           TCG, 4 vCPUs"), lines
    assert any(line.startswith("VM died                      after the guest said its facts "
                               "(exit 9)") for line in lines), lines
    assert "(?, )" not in "\n".join(lines) and "None" not in lines[1], lines
    # and `harmony report --allow-incomplete` says them
    import harmony
    from harmony.cli.screens import incomplete_screen
    from harmony.results import captured

    screen = incomplete_screen(captured(harmony.load(tmp_path / "a", allow_incomplete=True)))
    assert "VM                           TCG, 4 vCPUs" in screen and "VM died" in screen, screen
    assert until(lambda: not tree(fake_vm), 5), tree(fake_vm)


def test_guest_error_reads_the_last_traceback_or_the_agents_last_word():
    console = ["[    1.0] virtme-ng-init: mounting", "Traceback (most recent call last):",
               '  File "x.py", line 1, in <module>', "    import harmony.analysis",
               "harmony.core.errors.ProbeError: tracefs: no such file", "[    2.1] reboot: "
               "Power down", "virtme-ng-init: script exited with code 1"]
    assert vm.guest_error(console) == "harmony.core.errors.ProbeError: tracefs: no such file"
    assert vm.guest_error(["[ 0.1] booting", "sh: 1: python3: not found",
                           "virtme-ng-init: script exited with code 127"]) == \
        "sh: 1: python3: not found"
    assert vm.guest_error(["[ 0.1] booting", "virtme-ng-init: x"]) is None


# --- the controller killed: the VM goes with it -------------------------------------------------

CONTROLLER = '''
import sys, time
from pathlib import Path
import pytest
from test_vm_channel import _plan, _runner, setup_fake_vm
tmp = Path(sys.argv[1])
setup_fake_vm(tmp, pytest.MonkeyPatch())
r = _runner(tmp)
with r:
    _plan(r, tmp / "a")
    try:
        r.flush()
    except Exception:
        pass
    print("between flushes", flush=True)
    time.sleep(600)
'''


@pytest.mark.parametrize("mode, moment", [("slow-boot", "booting"),
                                          ("slow-capture", "measuring"),
                                          ("ok", "between flushes")])
def test_a_controller_killed_at_any_moment_leaves_no_vm_running(fake_vm, tmp_path, mode,
                                                                moment):
    """SIGKILL of the controller while the guest boots, mid-capture and between two flushes:
    within a second nothing of the VM runs -- the reaper, virtme-ng, QEMU, the daemon that left
    their session (as virtiofsd does), the agent."""
    scratch = tmp_path / "tmpdir"           # where the controller makes the VM's job directory
    scratch.mkdir()
    env = {**os.environ, "FAKE_AGENT": mode, "TMPDIR": str(scratch),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, text=True)
    console = tmp_path / "a" / "vm-console.log"
    try:
        if moment == "between flushes":
            assert proc.stdout.readline().strip() == "between flushes"
        elif moment == "booting":
            # killed while the VM starts: at the latest once the agent runs (on a busy host the
            # tree may still be starting after 30 s, which is booting too: the gate is below)
            until(lambda: any("agent.py" in p for p in tree(fake_vm)), 30)
            assert tree(fake_vm), "the VM's tree never started"
        else:
            assert until(lambda: console.exists() and '"measuring"' in console.read_text(), 30)
        if moment != "booting":
            assert any("qemu-system" in p for p in tree(fake_vm)), tree(fake_vm)
        proc.kill()
        proc.wait()
        # gone, not left behind: the reaper ends the tree (bench/controller_death.py measures how
        # soon: ~0.1 s on a quiet host); a test's deadline is not a timing, and a busy CI host
        # (two test workers on two CPUs) may give the reaper its turn late
        assert until(lambda: not tree(fake_vm), 10.0), (moment, tree(fake_vm))
        # and the boot's job directory with it (removed by the reaper: its owner cannot)
        assert not list(scratch.glob("harmony-vm-*")), (moment, list(scratch.iterdir()))
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in tree(fake_vm):
            os.kill(int(p.split(":")[0]), signal.SIGKILL)


def test_the_reaper_passes_on_the_exit_status_and_kills_what_was_left(tmp_path):
    """Run alone: the command's status comes back (a signal as 128 + N), and a process the
    command left behind in its session -- or outside it, orphaned -- is killed."""
    from harmony.vm import reaper

    left = tmp_path / "left.pid"
    script = (f"sleep 600 & echo $! > {left}; "
              f"setsid sleep 601 & echo $! >> {left}; exit 3")
    rc = subprocess.run(reaper.command(["sh", "-c", script]), timeout=30).returncode
    assert rc == 3
    pids = [int(p) for p in left.read_text().split()]
    assert until(lambda: not any(_alive(p) for p in pids), 5)
    assert subprocess.run(reaper.command(["sh", "-c", "kill -TERM $$"]),
                          timeout=30).returncode == 128 + signal.SIGTERM


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_job_lines_round_trip_and_a_bad_one_is_named(tmp_path):
    from harmony.vm import guest

    exp = get_experiment("single-source")
    params = exp.resolve({"duration": "1"}, [0, 1])
    runs = [guest.PlannedRun.of(exp, params, [0, 1], tmp_path / "r", "tracefs", 0)]
    line = guest.job_line(runs, 4)
    assert "\n" not in line and json.loads(line)["job"] == 4
    assert guest.job_runs(json.loads(line), "x") == runs
    with pytest.raises(store.RunError, match="job line 1 of the agent's input is not JSON"):
        guest.serve_jobs(["{"], {})
    with pytest.raises(store.RunError, match=r"job line 2 .*: not a guest job"):
        guest.serve_jobs(["", json.dumps({"format": "other"})], {})
    assert guest.serve_jobs([json.dumps({"end": True}), "{"], {}) == 0


def test_a_vm_suites_runs_are_numbered_once_as_they_happen_with_an_eta(fake_vm, tmp_path):
    """The runner numbers the captures (companions included) as the guest makes them, after the
    boot, with an estimate once runs are done; nothing is numbered while they are planned."""
    import io

    from harmony.suite import Progress

    stream = io.StringIO()
    progress = Progress(99, 99.0, stream=stream)
    with _runner(tmp_path) as r:
        r.progress = progress
        for k in range(3):
            _plan(r, tmp_path / f"r{k}", seed=k)
        assert stream.getvalue() == ""
        progress.expect(*r.to_make())
        assert (progress.total_runs, progress.total_s) == (3, 3 * (1.0 + 0.25))
        r.flush()
    lines = stream.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["[1/3]", "[2/3]", "[3/3]"], lines
    assert [line.split()[1] for line in lines] == ["r0:", "r1:", "r2:"]
    assert "at least" in lines[0] and all(", ~" in line for line in lines[1:]), lines
