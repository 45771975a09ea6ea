"""Kernels under test in a VM, hermetically: kernel names and the cache (with fake apt and dpkg on
PATH), the virtme-ng command line of each QEMU setting, the guest agent's job file and lines,
landing its JSON rows into the tables a host capture writes, and reclaiming a dead VM's QEMU."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import until

from harmony import run, store
from harmony.core import osutil
from harmony.core.errors import KernelError, ParameterError, UnknownKernel
from harmony.core.osutil import proc_starttime
from harmony.experiments import get_experiment
from harmony.probes.proc_sched import KERNEL_COUNTERS
from harmony.probes.proc_stat import KERNEL_SAMPLES
from harmony.probes.sched_debug import KERNEL_NR_RUNNING
from harmony.vm import guest, kernels
from harmony.vm import machine as vm
from harmony.workload.tasks import TASKS, TaskSpec, layout_tasks, task_rows, tasks_frame


def bzimage(path: Path, release: str) -> Path:
    """A file with a Linux boot header naming ``release`` (what image_release reads)."""
    head = bytearray(0x1000)
    head[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", head, 0x20E, 0x400)
    text = f"{release} (builder@host) #1 SMP".encode()
    head[0x600:0x600 + len(text)] = text
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(head))
    return path


@pytest.fixture
def fake_apt(tmp_path, monkeypatch):
    """apt-cache, apt-get, dpkg-deb and depmod stand-ins on PATH; apt knows two 6.1 ABIs (55, 56)
    and 6.12.117; each call is logged to ``calls``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    scripts = {
        "apt-cache": r'''
if [ "$1" = search ]; then
  echo "linux-image-6.1.0-55-amd64-unsigned - Linux 6.1 for 64-bit PCs"
  echo "linux-image-6.1.0-56-amd64-unsigned - Linux 6.1 for 64-bit PCs"
  echo "linux-image-6.1.0-56-cloud-amd64-unsigned - Linux 6.1 for x86-64 cloud"
  echo "linux-image-6.12.117+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs"
elif [ "$1" = show ]; then
  case "$3" in *6.1.0-56*) echo "Version: 6.1.192-2";; *6.12*) echo "Version: 6.12.117-1";; esac
fi''',
        "apt-get": r'''
[ -n "$FAIL_DOWNLOAD" ] && { echo "E: cannot download" >&2; exit 100; }
touch "pkg_$(echo $3 | tr '=' '_')_amd64.deb"''',
        "dpkg-deb": r'''
rel=6.1.0-56-amd64
mkdir -p "$3/boot" "$3/lib/modules/$rel/kernel"
python3 -c "import sys; sys.path.insert(0, '$TESTS'); from test_vm import bzimage; '''
                    r'''from pathlib import Path; bzimage(Path('$3/boot/vmlinuz-$rel'), '$rel')"''',
        "depmod": r'''touch "$3/lib/modules/$4/modules.dep"''',
    }
    for name, body in scripts.items():
        f = bin_dir / name
        f.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n{body}\n')
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("TESTS", str(Path(__file__).parent))
    return log


def test_a_name_resolves_to_the_newest_package_apt_knows(fake_apt):
    assert kernels.resolve("debian:6.1") == ("linux-image-6.1.0-56-amd64-unsigned", "6.1.192-2")
    assert kernels.resolve("debian:6.12") == ("linux-image-6.12.117+deb12-amd64-unsigned",
                                              "6.12.117-1")
    with pytest.raises(KernelError, match=r"debian:6\.1-rt: apt knows no package"):
        kernels.resolve("debian:6.1-rt")


def test_unknown_kernels_are_bad_input_naming_the_known_ones(tmp_path):
    for spec, what in (("debian:5.10", "unknown kernel"),
                       ("./nope/bzImage", "no such kernel image")):
        with pytest.raises(UnknownKernel) as exc:
            kernels.check_spec(spec)
        assert str(exc.value).startswith(f"{what} {spec!r}: give one of debian:6.1, debian:6.1-rt, "
                                         "debian:6.12, debian:6.12-rt")
        assert isinstance(exc.value, ParameterError)      # exit status 2
    kernels.check_spec("debian:6.12-rt")
    kernels.check_spec(str(bzimage(tmp_path / "bzImage", "6.12.117")))


def test_fetch_unpacks_once_into_the_cache_and_reuses_it(fake_apt, tmp_path):
    cache = tmp_path / "cache"
    said = []
    k = kernels.fetch("debian:6.1", cache, said.append)
    d = cache / "linux-image-6.1.0-56-amd64-unsigned_6.1.192-2"
    assert k.image == d / "boot" / "vmlinuz-6.1.0-56-amd64" and k.image.is_file()
    assert k.release == "6.1.0-56-amd64" and k.moddir == d / "lib/modules/6.1.0-56-amd64"
    assert (k.moddir / "modules.dep").is_file()          # depmod ran at fetch time
    assert k.source == {"kind": "debian", "package": "linux-image-6.1.0-56-amd64-unsigned",
                        "version": "6.1.192-2"}
    assert said == [f"fetching linux-image-6.1.0-56-amd64-unsigned 6.1.192-2 into {cache}"]
    assert not list(d.rglob("*.deb"))                     # the package itself is not kept
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == [d.name]
    downloads = fake_apt.read_text().count("apt-get download")
    again = kernels.fetch("debian:6.1", cache)
    assert again == k and fake_apt.read_text().count("apt-get download") == downloads == 1
    assert [c.spec for c in kernels.cached(cache)] == ["debian:6.1"]
    assert kernels.kernel("debian:6.1", cache) == k


def test_a_failed_fetch_leaves_nothing_half_extracted(fake_apt, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FAIL_DOWNLOAD", "1")
    with pytest.raises(KernelError, match="apt-get download -q failed .*cannot download"):
        kernels.fetch("debian:6.1", cache)
    assert [p.name for p in cache.iterdir()] == [".lock"] and kernels.cached(cache) == []
    # a fetch killed half-way left its partial directory: the next fetch removes it
    dead = subprocess.Popen(["true"])
    dead.wait()
    (cache / f".partial-{dead.pid}-x" / "boot").mkdir(parents=True)
    monkeypatch.delenv("FAIL_DOWNLOAD")
    kernels.fetch("debian:6.1", cache)
    assert not list(cache.glob(".partial-*"))


def test_apt_unreachable_falls_back_to_the_cached_kernel(fake_apt, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    k = kernels.fetch("debian:6.1", cache)
    monkeypatch.setenv("PATH", "/nonexistent")     # no apt-cache at all
    assert kernels.fetch("debian:6.1", cache) == k
    with pytest.raises(KernelError, match="apt-cache is not installed"):
        kernels.fetch("debian:6.12", cache)


def test_an_image_path_is_used_as_it_is_with_the_modules_beside_it(tmp_path):
    image = bzimage(tmp_path / "root" / "boot" / "vmlinuz", "6.12.117")
    (tmp_path / "root" / "lib" / "modules" / "6.12.117").mkdir(parents=True)
    k = kernels.kernel(str(image))
    assert (k.release, k.moddir, k.source) == ("6.12.117", tmp_path / "root/lib/modules/6.12.117",
                                               {"kind": "image", "path": str(image)})
    alone = kernels.from_image(bzimage(tmp_path / "bare" / "bzImage", "6.1.0-x"))
    assert alone.moddir is None and alone.release == "6.1.0-x"
    (tmp_path / "text").write_text("not a kernel")
    with pytest.raises(KernelError, match="not a bzImage"):
        kernels.kernel(str(tmp_path / "text"))


# --- the virtme-ng command line -------------------------------------------------------------------

KERNEL = kernels.Kernel("debian:6.1", Path("/c/boot/vmlinuz-6.1.0-56-amd64"), "6.1.0-56-amd64",
                        None, {"kind": "debian", "package": "p", "version": "v"})


@pytest.mark.parametrize("setting,accel,extra,qemu", [
    ("", "tcg", ["--disable-kvm"], "-name harmony,debug-threads=on -accel tcg,thread=multi"),
    ("tcg=single", "tcg", ["--disable-kvm"],
     "-name harmony,debug-threads=on -accel tcg,thread=single"),
    ("tcg=icount,pin=on", "tcg", ["--disable-kvm", "--pin"],
     "-name harmony,debug-threads=on -accel tcg,thread=single -icount shift=auto"),
    ("accel=kvm,pin=0,1", "kvm", ["--pin", "0,1"], "-name harmony,debug-threads=on"),
])
def test_the_vng_command_of_each_setting(setting, accel, extra, qemu, monkeypatch):
    monkeypatch.setattr(vm, "virtiofs_works", lambda: True)
    s = vm.QemuSetting.parse(setting)
    argv = vm.vng_argv(KERNEL, 4, 2048, Path("/out"), ["python3", "-m", "harmony.vm.guest", "/j"],
                       s, accel)
    assert argv == ["vng", "--verbose", "--run", "/c/boot/vmlinuz-6.1.0-56-amd64", "--cpus", "4",
                    "--memory", "2048M", "--rwdir", "/out", *extra, f"--qemu-opts={qemu}", "--",
                    "python3 -m harmony.vm.guest /j"]
    assert vm.QemuSetting.parse(s.text()) == s            # the recorded text reads back


@pytest.mark.parametrize("says, works", [
    ("virtiofsd version 7.2.22 (Debian 1:7.2+dfsg-7)\nCopyright (c) 2003-2022 Fabrice Bellard "
     "and the QEMU Project developers", False),
    ("virtiofsd 1.10.1", True)])
def test_9p_is_forced_where_virtme_ng_would_wait_for_qemus_own_virtiofsd(tmp_path, monkeypatch,
                                                                          says, works):
    """QEMU's C virtiofsd answers --version but takes none of virtme-ng's options (virtme-ng
    waits 3.1 s a shared directory, then uses 9p): with it, vng is told --force-9p."""
    fake = tmp_path / "virtiofsd"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{says}\nEOF\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    vm.virtiofs_works.cache_clear()
    try:
        assert vm.virtiofs_works() is works
        argv = vm.vng_argv(KERNEL, 2, 512, Path("/out"), ["true"], vm.QemuSetting(), "tcg")
        assert ("--force-9p" in argv) is not works
    finally:
        vm.virtiofs_works.cache_clear()


def test_bad_qemu_settings_are_one_line_errors():
    for text, msg in (("tcg=fast", "--vm-qemu tcg=fast: choose auto|multi|single|icount"),
                      ("accel", "not 'accel'"), ("pin=x", "--vm-qemu pin=x: bad cpulist")):
        with pytest.raises(ParameterError, match=msg):
            vm.QemuSetting.parse(text)


def test_the_vcpu_threads_nice_value_is_part_of_the_setting():
    s = vm.QemuSetting.parse("tcg=single,nice=-20,pin=0,1")
    assert (s.tcg, s.nice, s.pin) == ("single", -20, "0,1")
    assert s.text() == "accel=auto,tcg=single,nice=-20,pin=0,1"
    assert vm.QemuSetting.parse(s.text()) == s
    for bad in ("nice=-21", "nice=20", "nice=x", "nice=1.5"):
        with pytest.raises(ParameterError, match=r"nice=.*: a nice value, -20\.\.19"):
            vm.QemuSetting.parse(bad)


def test_renice_gives_each_thread_the_value_once():
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert vm.renice_threads(child.pid, {0: child.pid, 1: child.pid}, 5) == [child.pid]
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 5
        group = Path(f"/proc/{child.pid}/autogroup")
        auto = Path("/proc/sys/kernel/sched_autogroup_enabled")
        if auto.exists() and auto.read_text().strip() == "1":
            assert group.read_text().split()[-1] == "5"                 # its session's weight
        assert vm.renice_threads(child.pid, {0: 2 ** 22 + 7}, 5) == []  # gone: left out
    finally:
        child.kill()
        child.wait()


def test_tcg_auto_is_multi_only_with_a_host_cpu_for_each_vcpu_thread():
    auto = vm.QemuSetting.parse("pin=on")
    assert auto.tcg == "auto"
    for vcpus, host, tcg in ((4, 2, "single"), (2, 2, "single"), (2, 3, "multi"), (4, 16, "multi")):
        got, why = auto.resolved(vcpus, host)
        assert (got.tcg, got.pin) == (tcg, "on") and why.startswith(f"tcg=auto: {tcg}"), why
    asked = vm.QemuSetting.parse("tcg=multi")
    assert asked.resolved(4, 2) == (asked, None)           # what a user asks for is kept
    machine = vm.VirtualMachine(KERNEL, 64)                # more vCPUs than any host here
    assert machine.setting.tcg == "single" and "64 vCPUs" in machine.describe()["qemu_setting_why"]


def test_tcg_asked_for_needs_no_test_boot():
    assert vm.accelerator(vm.QemuSetting(accel="tcg"), KERNEL) == (
        "tcg", "TCG asked for (--vm-qemu accel=tcg)")


def test_wait_fractions_are_the_run_delay_over_the_window():
    before = {0: (100, 1_000_000_000), 1: (100, 0)}
    after = {0: (900, 1_500_000_000), 1: (900, 2_000_000_000)}
    assert vm.wait_fractions(before, after, 4.0) == {0: 0.125, 1: 0.5}
    assert vm.wait_fractions(before, {0: after[0]}, 4.0) == {0: 0.125}   # a thread gone


THREADS = """
import threading, time
named_all = threading.Barrier(len(NAMES) + 1)
def named(name):
    tid = threading.get_native_id()
    with open(f"/proc/self/task/{tid}/comm", "w") as f:
        f.write(name)
    named_all.wait()
    time.sleep(60)
for name in NAMES:
    threading.Thread(target=named, args=(name,), daemon=True).start()
named_all.wait()        # "ready" once every thread carries its name, not as they start
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("names,vcpus,expect", [
    (("CPU 0/TCG", "CPU 1/TCG", "worker"), 2, [0, 1]),      # multi-threaded: a thread each
    (("ALL CPUs/TCG", "worker"), 4, [0, 0, 0, 0]),           # single-threaded: one for all
])
def test_vcpu_threads_by_name_one_thread_standing_for_all(names, vcpus, expect):
    """A process whose threads carry QEMU's names stands for QEMU: each vCPU maps to its thread;
    single-threaded TCG's one thread stands for every vCPU, whose waits are then its wait."""
    p = subprocess.Popen([sys.executable, "-c", f"NAMES = {list(names)!r}" + THREADS],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        threads = vm.vcpu_threads(p.pid, vcpus)
        tids = sorted(set(threads.values()))
        assert sorted(threads) == list(range(vcpus))
        assert [tids.index(threads[v]) for v in range(vcpus)] == expect
        for tid in tids:
            comm = Path(f"/proc/{p.pid}/task/{tid}/comm").read_text().strip()
            assert comm in names and comm != "worker"
        times = vm.vcpu_times(p.pid, threads)
        assert sorted(times) == list(range(vcpus)) and len({times[v] for v in times}) == len(tids)
    finally:
        p.kill()
        p.wait()


# --- the guest agent ------------------------------------------------------------------------------

def test_a_job_plans_what_capture_would_run(tmp_path):
    exp = get_experiment("work-conservation")           # it draws its idle time from the seed
    params = exp.resolve({}, [0, 1, 2, 3])
    planned = guest.PlannedRun.of(exp, params, [0, 1, 2, 3], tmp_path / "r", "tracefs", seed=3)
    drawn = {**params, **exp.draw(params, [0, 1, 2, 3], 3)}
    assert planned.params == drawn and planned.params != params
    guest.write_job(tmp_path / "job.json", [planned])
    (back,) = guest.read_job(tmp_path / "job.json")
    stand_in = guest.PlannedExperiment(back)
    assert stand_in.draw(back.params, back.cpus, 3) == {}
    assert stand_in.tasks(back.params, back.cpus) == exp.tasks(drawn, [0, 1, 2, 3])
    (tmp_path / "bad.json").write_text('{"runs": []}')
    with pytest.raises(store.RunError, match="bad.json: not a guest job"):
        guest.read_job(tmp_path / "bad.json")


def test_agent_lines_round_trip_and_console_noise_is_not_one(capsys):
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    guest.emit("measuring", run=2)
    line = capsys.readouterr().out
    event = vm.parse_line(line.rstrip("\n"))
    assert line.startswith('@harmony {"event": "measuring", "mono_ns": ') and line.endswith("\n")
    assert event == {"event": "measuring", "mono_ns": event["mono_ns"], "run": 2}
    assert before <= event["mono_ns"] <= time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    for noise in ("[    3.83] virtme initramfs: done", '@harmony {"event": "meas',
                  '@harmony ["x"]', "@harmony {}"):
        assert vm.parse_line(noise) is None


def test_importing_the_guest_agent_loads_no_pandas():
    """Nor numpy: over a TCG guest's 9p its 84 modules took 6 s of the boot."""
    code = ("import sys, harmony.vm.guest, harmony.vm.machine; "
            "print(sorted(m for m in ('pandas', 'numba', 'matplotlib', 'pyarrow', 'scipy', "
            "'numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_landing_json_rows_gives_the_tables_a_host_capture_writes(tmp_path):
    specs = [TaskSpec("a", cut_duty_at_s=0.5, cut_duty=10.0), TaskSpec("b", nice=3)]
    sides = {"tasks": task_rows(specs, [11, 12]),
             "kernel_samples": [(5, 100, 11, 1, "R"), (9, 120, 12, 0, "S")],
             "kernel_counters": [("start", 11, 1, 2, 0, 5, 70, 3, 0),
                                 ("end", 11, 8, 9, 2, 40, 900, -1, -1)],
             "kernel_nr_running": [(6, 5, 7, 0, 2, 2, 1, 0, 1, "kworker/0:1")]}
    host, guest_dir = tmp_path / "host", tmp_path / "guest"
    host.mkdir()
    guest_dir.mkdir()
    for name, rows in sides.items():
        run.ParquetTables().put(host, name, rows)
        assert run.JsonRows().put(guest_dir, name, rows) is None
    assert sorted(run.land(guest_dir)) == sorted(sides)
    assert not list(guest_dir.glob("*.json"))
    for name, table in (("tasks", TASKS), ("kernel_samples", KERNEL_SAMPLES),
                        ("kernel_counters", KERNEL_COUNTERS),
                        ("kernel_nr_running", KERNEL_NR_RUNNING)):
        a, b = (store.read_table(d / f"{name}.parquet") for d in (host, guest_dir))
        table.check(b)
        pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(store.read_table(host / "tasks.parquet"),
                                  tasks_frame(specs, [11, 12]))
    tasks_frame(layout_tasks([2, 0], [0, 1]))       # no pid: -1, as before
    store.write_json(guest_dir / "tasks.rows.json", {"table": "runs", "rows": []})
    with pytest.raises(store.RunError, match="tasks.rows.json: not the rows of table tasks"):
        run.land(guest_dir)


def test_a_run_made_in_memory_is_handed_over_in_one_file_and_unpacked_as_made(tmp_path):
    """A guest's run (harmony.run.Staged): made in memory, its probe's data files streamed into
    the run directory through links (one the probe never wrote is not made), the rest (the
    probe's meta and a server's records in raw/ too) handed over as one file; unpacked, the run
    directory holds every file as made, and the memory and the file are gone."""
    final, memory = tmp_path / "r", tmp_path / "memory"
    memory.mkdir()
    store.make_run_dir(final)
    staged = run.Staged(final, str(memory), streamed={"tracefs": ["cpu0.raw", "cpu1.raw"]})
    assert (staged.path / "raw" / "tracefs" / "cpu0.raw").is_symlink()
    assert staged.path.parent == memory
    (staged.path / "raw" / "tracefs" / "cpu0.raw").write_bytes(b"\x01" * 5000)  # cpu1: none
    made = {"manifest.json": b'{"status": "captured"}\n', "tasks.rows.json": b"[1, 2]\n",
            "raw/requests/stage0.bin": bytes(range(256)) * 40,
            "raw/tracefs/meta.json": b'{"probe": "tracefs"}'}
    for name, data in made.items():
        (staged.path / name).parent.mkdir(parents=True, exist_ok=True)
        (staged.path / name).write_bytes(data)
    assert [p.name for p in final.iterdir()] == ["raw"]             # nothing else of it yet
    assert [p.name for p in (final / "raw" / "tracefs").iterdir()] == ["cpu0.raw"]
    staged.hand_over()
    assert not list(memory.iterdir())
    assert sorted(p.name for p in final.iterdir()) == [run.HANDED_NAME, "raw"]
    assert run.unpack(final) and not run.unpack(final)
    for name, data in made.items():
        assert (final / name).read_bytes() == data
    assert (final / "raw" / "tracefs" / "cpu0.raw").read_bytes() == b"\x01" * 5000
    assert not (final / run.HANDED_NAME).exists()
    assert sorted(p.name for p in (final / "raw" / "tracefs").iterdir()) == ["cpu0.raw",
                                                                            "meta.json"]
    # a failed capture's memory is freed too, what it made handed over all the same
    staged = run.Staged(tmp_path / "r2", str(memory))
    (staged.path / "manifest.json").write_text('{"status": "incomplete"}')
    staged.hand_over()
    assert not list(memory.iterdir())
    assert run.land(tmp_path / "r2") == [] and store.read_json(
        tmp_path / "r2" / "manifest.json")["status"] == "incomplete"


@pytest.mark.parametrize("bad", ["truncated", "outside", "link"])
def test_a_handed_over_run_that_is_not_one_is_refused_naming_its_file(tmp_path, bad):
    """A truncated archive, or one naming a file outside the run or a link: one RunError naming
    the file; nothing is written outside the run, nor any link."""
    import io
    import tarfile

    final = tmp_path / "deep" / "r"
    store.make_run_dir(final)
    path = final / run.HANDED_NAME
    with tarfile.open(path, "w") as tar:
        def add(name, data=b"x", kind=tarfile.REGTYPE):
            info = tarfile.TarInfo(name)
            info.size, info.type = (len(data), kind)
            if kind == tarfile.SYMTYPE:
                info.size, info.linkname = 0, "/etc/passwd"
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        add("manifest.json", b"{}" * 3000)
        add({"truncated": "tasks.rows.json", "outside": "../../evil", "link": "records"}[bad],
            kind=tarfile.SYMTYPE if bad == "link" else tarfile.REGTYPE)
    if bad == "truncated":
        path.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(store.RunError, match=f"{path}: ") as err:
        run.land(final)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "evil").exists() and not (final / "records").exists()


def test_the_formats_a_guest_writes_in_one_file_land_as_the_directory_a_host_writes(
        tmp_path, monkeypatch):
    """The VM agent's probes write a run's trace formats as one file (a round trip on the share
    instead of ~28); landed, they are the tree a probe writes on the host, byte for byte."""
    from harmony.probes.tracefs import FORMATS_FILE, TracefsProbe

    root = tmp_path / "tracefs"
    texts = {"header_page": b"field: u64 timestamp;\n", "header_event": b"type_len : 5 bits\n",
             "sched/sched_switch/format": b"name: sched_switch\nID: 316\n\xe9",
             "ftrace/print/format": b"name: print\n"}
    for rel, data in texts.items():
        (root / "events" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "events" / rel).write_bytes(data)
    enabled = ["sched/sched_switch", "ftrace/print"]
    host, guest_dir = tmp_path / "host" / "raw" / "tracefs", tmp_path / "guest"
    TracefsProbe(host, [0], 1.0)._save_formats(root, enabled)
    monkeypatch.setattr(TracefsProbe, "_formats_one_file", True)
    TracefsProbe(guest_dir / "raw" / "tracefs", [0], 1.0)._save_formats(root, enabled)
    assert sorted(p.name for p in (guest_dir / "raw" / "tracefs").iterdir()) == [FORMATS_FILE]
    assert run.land(guest_dir) == ["tracefs formats"]

    def tree(d):
        return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}
    assert tree(guest_dir / "raw" / "tracefs") == tree(host)
    assert len(tree(host)) == 4
    for bad, why in (("[1]", "not the trace formats of a run"),
                     ('{"formats/../../x": ""}', "a file outside formats/")):
        (guest_dir / "raw" / "tracefs" / FORMATS_FILE).write_text(bad)
        with pytest.raises(store.RunError, match=f"{FORMATS_FILE}: {why}"):
            run.land(guest_dir)
    assert not (tmp_path / "x").exists()


# --- a dead controller's VM -----------------------------------------------------------------------

def _lock_dir_in(path, monkeypatch):
    """The VM's records (and KVM verdicts) go to ``path`` instead of the host's lock directory."""
    monkeypatch.setattr(osutil, "LOCK_DIRS", (path,))
    monkeypatch.setattr(osutil, "lock_dir", lambda: path)
    monkeypatch.setattr(vm, "lock_dir", lambda: path)


def test_reclaim_kills_the_qemu_of_a_dead_controller_and_nothing_else(tmp_path, monkeypatch):
    _lock_dir_in(tmp_path, monkeypatch)
    qemu = subprocess.Popen(["sleep", "60"])       # stands for QEMU
    other = subprocess.Popen(["sleep", "60"])      # a live controller's: left alone
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        def record(name, owner, start, pid):
            (tmp_path / name).write_text(json.dumps({
                "controller_pid": owner, "controller_start": start, "kernel": "debian:6.1",
                "pids": [{"pid": pid, "start": proc_starttime(pid)}]}))

        record("vm-1.json", dead.pid, 12345, qemu.pid)
        record("vm-2.json", os.getpid(), proc_starttime(os.getpid()), other.pid)
        # a record whose process was recycled (another start time) kills nothing
        (tmp_path / "vm-3.json").write_text(json.dumps({
            "controller_pid": dead.pid, "pids": [{"pid": other.pid, "start": 1}]}))
        assert vm.reclaim_stale() == [f"VM process {qemu.pid} (sleep) of kernel debian:6.1"]
        assert qemu.wait(timeout=10) == -signal.SIGKILL
        assert other.poll() is None
        assert sorted(p.name for p in tmp_path.iterdir()) == ["vm-2.json"]
    finally:
        for p in (qemu, other):
            p.kill()
            p.wait()


def test_a_vm_that_never_speaks_is_killed_at_the_boot_deadline(tmp_path, monkeypatch):
    """virtme-ng stands in as a script that prints console lines then hangs: the boot timeout
    ends it, the error names the kernel and quotes the console, and nothing is left running."""
    _lock_dir_in(tmp_path, monkeypatch)
    fake = tmp_path / "vng"
    fake.write_text("#!/bin/sh\necho '[ 0.1] booting'\necho '[ 0.2] still booting'\n"
                    "sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    machine = vm.VirtualMachine(KERNEL, 2, setting=vm.QemuSetting(accel="tcg"), boot_timeout=1.5)
    t0 = time.monotonic()
    with pytest.raises(vm.VmError, match=r"^kernel debian:6\.1: the guest did not boot within 2 s"
                                         r".*console: \[ 0\.1\] booting \| "
                                         r"\[ 0\.2\] still booting"):
        machine.run(["true"], tmp_path, lambda ev, t: None)
    assert time.monotonic() - t0 < 60
    assert machine.proc.poll() is not None           # its whole process group was killed
    assert not list(tmp_path.glob("vm-*.json"))


def test_a_guest_kernel_panic_ends_the_vm_at_once(tmp_path, monkeypatch):
    _lock_dir_in(tmp_path, monkeypatch)
    fake = tmp_path / "vng"
    fake.write_text("#!/bin/sh\necho '@harmony {\"event\": \"facts\", \"facts\": {}}'\n"
                    "echo '[ 9.9] Kernel panic - not syncing: Fatal exception'\nsleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    events = []
    machine = vm.VirtualMachine(KERNEL, 2, setting=vm.QemuSetting(accel="tcg"))
    with pytest.raises(vm.VmError, match=r"kernel debian:6\.1: the guest kernel died: \[ 9\.9\] "
                                         "Kernel panic - not syncing"):
        machine.run(["true"], tmp_path, lambda ev, t: events.append(ev["event"]))
    assert events == ["facts"] and machine.boot_s is not None
    assert machine.proc.poll() is not None


def test_ctrl_c_during_a_vm_run_ends_it_in_one_line_with_nothing_left(tmp_path):
    """`harmony run --kernel IMAGE` with virtme-ng standing in as a script whose guest agent said
    its facts and then hangs: SIGINT to the controller ends it with one line, the VM's whole
    process group is killed, and the run is marked incomplete."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pidfile = tmp_path / "vng.pid"
    fake = bin_dir / "vng"
    # written whole and renamed: `>` creates the file empty before echo fills it, and the wait
    # below, seeing it exist, once read it in between
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}\n"
                    "echo '@harmony {\"event\": \"facts\", \"facts\": {}}'\nexec sleep 600\n")
    fake.chmod(0o755)
    image = bzimage(tmp_path / "img" / "bzImage", "6.12.0-fake")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = tmp_path / "run"
    deadline = time.monotonic() + 300
    while True:                 # another Harmony run holds the host: wait, as cli() does
        proc = subprocess.Popen([sys.executable, "-m", "harmony.cli", "run", "single-source",
                                 "--kernel", str(image), "--vm-cpus", "2", "--vm-qemu", "accel=tcg",
                                 "--out", str(out)], env=env, stderr=subprocess.PIPE, text=True)
        if not until(lambda: pidfile.exists() or proc.poll() is not None, 60):
            break
        if proc.poll() is None or time.monotonic() > deadline:
            break
        err = proc.stderr.read()
        assert "another Harmony run" in err, err
        time.sleep(2)
    try:
        assert pidfile.exists(), "the fake virtme-ng never started"
        vng_pid = int(pidfile.read_text())
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        err = proc.stderr.read()
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [line for line in err.splitlines() if line.startswith("harmony:")]
    assert len(lines) == 1 and "interrupted" in lines[0], err
    assert "Traceback" not in err
    assert until(lambda: not Path(f"/proc/{vng_pid}").exists()
                 or Path(f"/proc/{vng_pid}/stat").read_text().split(") ")[1][0] == "Z", 10)
    m = store.read_json(out / "manifest.json")
    assert m["status"] == "incomplete", m.get("status")


def test_an_exited_reaper_waiting_for_init_is_not_reclaimed_as_a_live_vm_process():
    """After a controller's kill its reaper exits and waits, a zombie, for init to reap it: the
    next start or `harmony clean` must not report it as a VM process it removed (a zombie runs
    nothing, and its pid and start time still match its record)."""
    from harmony.core.osutil import proc_starttime, proc_zombie

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        assert until(lambda: proc_zombie(pid), 5)
        assert proc_starttime(pid) is not None          # what the record's check alone sees
        assert not proc_zombie(os.getpid())
    finally:
        os.waitpid(pid, 0)
    assert not proc_zombie(pid)                          # gone: not a zombie either


def test_the_next_start_removes_the_job_directories_of_controllers_gone(tmp_path, monkeypatch):
    """A boot's job directory is named for its controller (pid and start time): reclaim_stale
    (every start, `harmony clean`) removes those whose controller is gone -- killed before its
    reaper could remove it -- and leaves a living controller's and anything not Harmony's."""
    import tempfile

    from harmony.core.osutil import proc_starttime
    from harmony.vm import machine

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = machine.make_job_dir()
    child = subprocess.Popen(["true"])
    child.wait()
    gone = tmp_path / f"harmony-vm-{child.pid}-{proc_starttime(os.getpid())}-x1"
    recycled = tmp_path / f"harmony-vm-{os.getpid()}-{proc_starttime(os.getpid()) + 1}-x2"
    other = tmp_path / "harmony-vm-notes"
    for d in (gone, recycled, other):
        d.mkdir()
        (d / "job.json").write_text("{}")
    said = machine.reclaim_stale()
    assert mine.is_dir() and other.is_dir()
    assert not gone.exists() and not recycled.exists()
    assert sorted(line.split()[3] for line in said if "job directory" in line) == \
        sorted([str(gone), str(recycled)])
