"""What this host is: CPUs, topology, kernel, the scheduler in charge and the facilities it offers.

Pure reads of sysfs, procfs and tracefs: nothing here writes, mounts or records, so any module
may ask (the controller reads the sched_ext state here, ``harmony doctor`` and the probes read
the rest). Everything *detects*; nothing assumes: a fact the host does not show is None, and the
functions say where they looked. Paths are read from the module's constants at call time (tests
point them at fake trees).

The shape of an answer about the host is here too, for every module that gives one
(:mod:`harmony.doctor`, each probe's ``doctor_check``,
:func:`harmony.workload.controller.release_check`):
:func:`check` makes a dict with at least ``status`` (:data:`OK`, :data:`WARN` or :data:`MISSING`)
and ``detail`` (one line for humans); the other keys are the machine-readable facts.
"""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

from harmony.core.osutil import format_cpulist, online_cpus, read_cpulist_file

OK, WARN, MISSING = "ok", "warn", "missing"

SYSFS = Path("/sys")
PROC = Path("/proc")
TRACEFS_DEFAULT = Path("/sys/kernel/tracing")
TRACEFS_LEGACY = Path("/sys/kernel/debug/tracing")
DEBUGFS_DEFAULT = Path("/sys/kernel/debug")
SCHED_EXT_DIR = Path("/sys/kernel/sched_ext")


def check(status: str, detail: str, **facts) -> dict:
    """One answer about the host: ``{"status", "detail", **facts}`` (see the module docstring)."""
    return {"status": status, "detail": detail, **facts}


def read_text(path: Path) -> str | None:
    """The stripped text of a file, or None if it is missing or unreadable."""
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_int(path: Path) -> int | None:
    """The integer a file holds, or None if it is missing, unreadable or not an integer."""
    text = read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# CPUs and topology


def possible_cpus() -> list[int] | None:
    """The CPUs this kernel could bring online (``cpu/possible``); None if sysfs does not say."""
    return read_cpulist_file(SYSFS / "devices/system/cpu/possible")


def _llc_of(cache_dir: Path) -> tuple[dict | None, str | None]:
    """(LLC facts, None) for one CPU's cache/ directory, or (None, why not)."""
    if not cache_dir.is_dir():
        return None, "cache/"
    best = None
    for index in sorted(cache_dir.glob("index*")):
        level = read_int(index / "level")
        ctype = read_text(index / "type")
        if level is None or ctype == "Instruction":
            continue
        rank = (level, ctype == "Unified")
        if best is None or rank > best[0]:
            best = (rank, index)
    if best is None:
        return None, "cache/index*/level"
    index = best[1]
    shared = read_cpulist_file(index / "shared_cpu_list")
    if not shared:
        return None, f"cache/{index.name}/shared_cpu_list"
    return {"index": index.name, "level": best[0][0], "cpus": shared,
            "id": read_int(index / "id")}, None


def _numa_nodes(sysfs: Path) -> dict[int, int] | None:
    """{cpu: node} from /sys/devices/system/node/node*/cpulist, None if there is no node/ dir."""
    node_dir = sysfs / "devices/system/node"
    if not node_dir.is_dir():
        return None
    mapping: dict[int, int] = {}
    for d in node_dir.glob("node[0-9]*"):
        cpus = read_cpulist_file(d / "cpulist")
        if cpus is None:
            continue
        node = int(d.name[4:])
        for c in cpus:
            mapping[c] = node
    return mapping


def _group(cpus: list[dict], key) -> list[list[int]]:
    groups: dict = {}
    for c in cpus:
        k = key(c)
        if k is None:
            continue
        groups.setdefault(k, []).append(c["cpu"])
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


def topology(sysfs: str | Path | None = None) -> dict:
    """Per-online-CPU topology from sysfs (default :data:`SYSFS`) plus counts and groupings.

    Returns ``{"cpus": [{"cpu", "package", "die", "core", "siblings", "llc_index", "llc_level",
    "llc_cpus", "llc_id", "node"}, ...], "counts": {"packages", "cores", "threads", "llcs",
    "numa_nodes"}, "groups": {"smt", "llc", "package", "numa"}, "smt_active", "notes"}``.
    A field sysfs does not provide is None, with a note naming the file and the CPUs concerned.
    """
    sysfs = Path(SYSFS if sysfs is None else sysfs)
    online = online_cpus(sysfs)
    nodes = _numa_nodes(sysfs)
    missing: dict[str, list[int]] = {}
    rows = []
    for cpu in online:
        base = sysfs / f"devices/system/cpu/cpu{cpu}"
        topo = base / "topology"

        def field(name, reader, _topo=topo, _cpu=cpu):
            value = reader(_topo / name)
            if value is None:
                missing.setdefault(f"topology/{name}", []).append(_cpu)
            return value

        package = field("physical_package_id", read_int)
        core = field("core_id", read_int)
        die = read_int(topo / "die_id")  # only on kernels/arches that have dies; no note
        siblings = (read_cpulist_file(topo / "core_cpus_list")
                    or read_cpulist_file(topo / "thread_siblings_list"))
        if not siblings:
            siblings = None
            missing.setdefault("topology/thread_siblings_list", []).append(cpu)
        llc, why = _llc_of(base / "cache")
        if llc is None:
            missing.setdefault(why, []).append(cpu)
            llc = {}
        if nodes is None:
            node = None
        else:
            node = nodes.get(cpu)
            if node is None:
                missing.setdefault("node*/cpulist entry", []).append(cpu)
        rows.append(
            {
                "cpu": cpu,
                "package": package,
                "die": die,
                "core": core,
                "siblings": siblings,
                "llc_index": llc.get("index"),
                "llc_level": llc.get("level"),
                "llc_cpus": llc.get("cpus"),
                "llc_id": llc.get("id"),
                "node": node,
            }
        )
    notes = [f"no {what} for CPUs {format_cpulist(cpus)}" for what, cpus in missing.items()]
    if nodes is None:
        notes.append("no /sys/devices/system/node (kernel without NUMA?): node is None")

    def core_key(r):
        if r["siblings"]:
            return tuple(r["siblings"])
        if r["core"] is not None:
            return ("core", r["package"], r["die"], r["core"])
        return None

    groups = {
        "smt": _group(rows, core_key),
        "llc": _group(rows, lambda r: tuple(r["llc_cpus"]) if r["llc_cpus"] else None),
        "package": _group(rows, lambda r: r["package"]),
        "numa": _group(rows, lambda r: r["node"]),
    }
    counts = {
        "packages": len(groups["package"]) or None,
        "cores": len(groups["smt"]) or None,
        "threads": len(rows),
        "llcs": len(groups["llc"]) or None,
        "numa_nodes": len(groups["numa"]) or None,
    }
    smt = read_text(sysfs / "devices/system/cpu/smt/active")
    smt_active = {"1": True, "0": False}.get(smt) if smt is not None else None
    if smt_active is None and groups["smt"]:
        smt_active = any(len(g) > 1 for g in groups["smt"])
    return {"cpus": rows, "counts": counts, "groups": groups, "smt_active": smt_active,
            "notes": notes}


def isolation() -> dict:
    """The CPUs the kernel keeps from the balancer or the tick: ``{"isolated": cpus, "nohz_full":
    cpus, "cmdline": {"isolcpus"/"nohz_full": value}}``; a list is None where sysfs has no such
    file (``nohz_full`` is absent from kernels built without it)."""
    cpu_dir = SYSFS / "devices/system/cpu"
    cmdline = read_text(PROC / "cmdline") or ""
    return {
        "isolated": read_cpulist_file(cpu_dir / "isolated"),
        "nohz_full": read_cpulist_file(cpu_dir / "nohz_full"),
        "cmdline": {k: v for k, _, v in (a.partition("=") for a in cmdline.split())
                    if k in ("isolcpus", "nohz_full")},
    }


# --------------------------------------------------------------------------------------------
# kernel, scheduler, config


def memory_available() -> int:
    """Bytes of memory this host can give a process now without swapping (MemAvailable); tests
    monkeypatch this to simulate a small host."""
    import psutil  # here: most host reads need no psutil
    return int(psutil.virtual_memory().available)


def is_root() -> bool:
    """Whether this process runs as root (tests monkeypatch this to simulate a user)."""
    return os.geteuid() == 0


def kernel_version(release: str | None = None) -> tuple[int, int] | None:
    """(major, minor) of a kernel release string such as ``"6.18.44-fc"``; None if unparsable."""
    release = os.uname().release if release is None else release
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else None


def sched_ext_state(root: str | Path | None = None) -> dict:
    """``{"state": "not built" | <contents of state>, "ops": name or None, "switch_all":
    bool|None}`` from ``root`` (default :data:`SCHED_EXT_DIR`)."""
    root = Path(SCHED_EXT_DIR if root is None else root)
    state = sched_ext_state_word(root)
    if state == "not built":
        return {"state": state, "ops": None, "switch_all": None}
    ops = read_text(root / "root/ops") or None
    switch_all = read_text(root / "switch_all")
    return {"state": state, "ops": ops, "switch_all": {"1": True, "0": False}.get(switch_all)}


def sched_ext_state_word(root: str | Path | None = None) -> str:
    """:func:`sched_ext_state`'s ``state`` alone, one file read: what a watcher polls."""
    state = read_text(Path(SCHED_EXT_DIR if root is None else root) / "state")
    return "not built" if state is None else state


def scheduler_name(release: str | None = None, sched_ext_root: str | Path | None = None) -> str:
    """The scheduler in charge of normal tasks: the sched_ext ops name when a BPF scheduler is
    enabled, else the one the release implies (:func:`implied_scheduler`), ``"unknown"`` if
    neither says."""
    scx = sched_ext_state(sched_ext_root)
    if scx["state"] == "enabled":
        return scx["ops"] or "sched_ext"
    return implied_scheduler(release) or "unknown"


def implied_scheduler(release: str | None = None) -> str | None:
    """The fair-class scheduler a kernel release implies: ``"EEVDF"`` from 6.6 on, ``"CFS"``
    below; None when ``release`` is no version. A release cannot show a sched_ext scheduler that
    was enabled on that kernel: for the running host, :func:`scheduler_name` looks."""
    version = kernel_version(release)
    if version is None:
        return None
    return "EEVDF" if version >= (6, 6) else "CFS"


#: the environment variable naming the config of the kernel running (set by the VM runner for
#: its guest: a Debian kernel's /boot is not the guest's, nor has a built one /proc/config.gz)
KERNEL_CONFIG_ENV = "HARMONY_KERNEL_CONFIG"


def kernel_config(release: str | None = None) -> tuple[dict[str, str], str | None]:
    """({CONFIG_X: value}, source path) from the file :data:`KERNEL_CONFIG_ENV` names, else
    /boot/config-<release> or /proc/config.gz."""
    release = os.uname().release if release is None else release
    text, source = None, None
    paths = [Path(p) for p in [os.environ.get(KERNEL_CONFIG_ENV)] if p]
    for path in [*paths, Path(f"/boot/config-{release}")]:
        try:
            text, source = path.read_text(errors="replace"), str(path)
            break
        except OSError:
            continue
    if text is None:
        try:
            with gzip.open(PROC / "config.gz", "rt", errors="replace") as f:
                text, source = f.read(), str(PROC / "config.gz")
        except (OSError, EOFError):
            pass
    config: dict[str, str] = {}
    for line in (text or "").splitlines():
        if line.startswith("CONFIG_") and "=" in line:
            k, v = line.split("=", 1)
            config[k] = v.strip().strip('"')
    return config, source


def config_hz(config: dict) -> int | None:
    """The tick rate (``CONFIG_HZ``) of a :func:`kernel_config`; None if it does not say."""
    try:
        return int(config["CONFIG_HZ"])
    except (KeyError, ValueError):
        return None


_PREEMPT_CONFIG = (
    ("CONFIG_PREEMPT_RT", "rt"),
    ("CONFIG_PREEMPT_LAZY", "lazy"),
    ("CONFIG_PREEMPT", "full"),
    ("CONFIG_PREEMPT_VOLUNTARY", "voluntary"),
    ("CONFIG_PREEMPT_NONE", "none"),
)


def preemption(debugfs: str | None, config: dict, config_source: str | None) -> dict:
    """The preemption model and where it was seen: ``{"model", "dynamic", "source", "seen_in",
    "choices"}``. Looked for in this order (``seen_in``): ``"sched/preempt"`` in debugfs (the
    current mode of a PREEMPT_DYNAMIC kernel; ``choices`` is the file's text), ``"cmdline"``
    (``preempt=`` on a PREEMPT_DYNAMIC kernel), ``"config"`` (the model built in, or the boot
    default of a dynamic kernel), ``"uname"`` (a word of ``uname -v``; ``model`` None for a dynamic
    kernel) and None (nowhere)."""
    build = os.uname().version
    dynamic = config.get("CONFIG_PREEMPT_DYNAMIC") == "y" or "PREEMPT_DYNAMIC" in build

    def seen(model, seen_in, source, dynamic=dynamic, choices=None):
        return {"model": model, "dynamic": dynamic, "source": source, "seen_in": seen_in,
                "choices": choices}

    if debugfs:
        path = Path(debugfs) / "sched/preempt"
        text = read_text(path)
        m = re.search(r"\((\w+)\)", text or "")
        if m:
            return seen(m.group(1), "sched/preempt", str(path), dynamic=True, choices=text)
    cmdline = read_text(PROC / "cmdline") or ""
    m = re.search(r"(?:^|\s)preempt=(\w+)", cmdline)
    if m and dynamic:
        return seen(m.group(1), "cmdline", "/proc/cmdline", dynamic=True)
    for key, model in _PREEMPT_CONFIG:
        if config.get(key) == "y":
            return seen(model, "config", config_source)
    for word, model in (("PREEMPT_RT", "rt"), ("PREEMPT_DYNAMIC", None), ("PREEMPT", "full")):
        if word in build.split():
            return seen(model, "uname", "uname -v")
    return seen(None, None, None)


# --------------------------------------------------------------------------------------------
# mounts


def mounts() -> list[tuple[str, str, str]]:
    """(mountpoint, fstype, options) of every mount, from /proc/mounts."""
    out = []
    text = read_text(PROC / "mounts") or ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])
            out.append((mnt, parts[2], parts[3]))
    return out


def mountpoints(fstype: str) -> list[str]:
    """Where file systems of type ``fstype`` are mounted, in /proc/mounts order."""
    return [m for m, t, _ in mounts() if t == fstype]


def cgroup_mounts() -> tuple[list[str], list[str]]:
    """(cgroup2 mount points, cgroup v1 mount points with the cpuset controller)."""
    every = mounts()
    v2 = [m for m, t, _ in every if t == "cgroup2"]
    v1_cpuset = [m for m, t, o in every if t == "cgroup" and "cpuset" in o.split(",")]
    return v2, v1_cpuset


def cgroup_controllers(path: str | Path) -> list[str]:
    """The controllers a cgroup2 directory offers (``cgroup.controllers``); [] if unreadable."""
    return (read_text(Path(path) / "cgroup.controllers") or "").split()


# --------------------------------------------------------------------------------------------
# tracing (tracefs mounted at ``tracefs``)


def tracepoints(tracefs: str | Path, system: str, names) -> list[str]:
    """Which of the tracepoints ``names`` of ``system`` this tracefs has (their ``format``
    exists), in the order given; OSError (PermissionError for a user) if ``events/`` cannot be
    listed."""
    events = Path(tracefs) / "events"
    os.listdir(events)
    return [t for t in names if (events / system / t / "format").exists()]


def markers(tracefs: str | Path) -> tuple[bool, bool]:
    """(the ``ftrace:print`` event exists, ``trace_marker`` exists): what a marker needs."""
    tracefs = Path(tracefs)
    return (tracefs / "events/ftrace/print/format").exists(), (tracefs / "trace_marker").exists()


def trace_clocks(tracefs: str | Path) -> tuple[list[str], str | None] | None:
    """(the trace clocks this tracefs offers, the current one), or None if ``trace_clock`` cannot
    be read."""
    text = read_text(Path(tracefs) / "trace_clock")
    if text is None:
        return None
    available = [c.strip("[]") for c in text.split()]
    current = next((c.strip("[]") for c in text.split() if c.startswith("[")), None)
    return available, current


# --------------------------------------------------------------------------------------------
# real-time and deadline bandwidth

BW_SHIFT = 20  # the kernel's fixed point for bandwidths (kernel/sched/sched.h)


def rt_bandwidth(debugfs: str | Path | None = None) -> dict:
    """How much of a CPU the real-time and deadline classes may take, as the kernel says now.

    ``rt_runtime_us`` / ``rt_period_us``: /proc/sys/kernel/sched_rt_{runtime,period}_us (RT
    throttling: SCHED_FIFO / SCHED_RR tasks together get at most runtime of every period of each
    CPU; -1 = no limit); ``rt_share``: their ratio (None when unlimited or unreadable).
    ``dl_bw_per_cpu`` and ``dl_reserved``: from sched/debug's first ``dl_rq``, the share of each
    CPU SCHED_DEADLINE admission control allows and the CPUs' worth already admitted in its root
    domain (the fair class's deadline servers, 6.12 on, and any deadline task); None where
    sched/debug is not readable. ``dl_rd_cpus``: the CPUs of that root domain (assumed: all
    online CPUs, as without isolated partitions)."""
    runtime = read_int(PROC / "sys/kernel/sched_rt_runtime_us")
    period = read_int(PROC / "sys/kernel/sched_rt_period_us")
    out = {"rt_runtime_us": runtime, "rt_period_us": period,
           "rt_share": (runtime / period if runtime is not None and runtime >= 0 and period
                        else None),
           "dl_bw_per_cpu": None, "dl_reserved": None, "dl_rd_cpus": len(online_cpus())}
    text = read_text(Path(debugfs or DEBUGFS_DEFAULT) / "sched/debug") or ""
    block = re.search(r"^dl_rq\[\d+\]:\n((?:\s+\..*\n?)+)", text, re.M)
    if block:
        fields = dict(re.findall(r"\.(\S+)\s*:\s*(-?\d+)", block.group(1)))
        bw, total = fields.get("dl_bw->bw"), fields.get("dl_bw->total_bw")
        if bw is not None and int(bw) >= 0:
            out["dl_bw_per_cpu"] = int(bw) / (1 << BW_SHIFT)
        if total is not None:
            out["dl_reserved"] = int(total) / (1 << BW_SHIFT)
    return out
