"""What this host can do: CPUs, topology, tracing facilities and the scheduler in charge.

Everything here *detects*; nothing assumes. The entry point behind ``harmony doctor`` is
:func:`doctor`, which returns JSON-serialisable facts, and :func:`format_doctor`, which renders
them as a compact table. :func:`doctor` leaves no kernel state behind: the tracefs instance it
creates to test instance support is removed in ``finally``, and it never enables an event in
tracefs (the perf test enables tracepoints only for the lifetime of a ~0.3 s ``perf record``).
The one lasting change it may make is mounting tracefs/debugfs when they are not mounted and it
runs as root; the facts say so (``mounted_by_doctor``).

Each check in the facts is a dict with at least ``status`` (``ok``, ``warn`` or ``missing``) and
``detail`` (one line for humans); the other keys are the machine-readable facts.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from harmony.osutil import (format_cpulist, online_cpus, parse_cpulist, pid_alive,  # noqa: F401
                            read_cpulist_file)

OK, WARN, MISSING = "ok", "warn", "missing"

SYSFS = Path("/sys")
PROC = Path("/proc")
TRACEFS_DEFAULT = Path("/sys/kernel/tracing")
TRACEFS_LEGACY = Path("/sys/kernel/debug/tracing")
DEBUGFS_DEFAULT = Path("/sys/kernel/debug")
SCHED_EXT_DIR = Path("/sys/kernel/sched_ext")

#: tracepoints the doctor looks for, in events/sched/ of tracefs
SCHED_TRACEPOINTS = (
    "sched_switch",
    "sched_migrate_task",
    "sched_wakeup",
    "sched_wakeup_new",
    "sched_waking",
    "sched_process_fork",
    "sched_process_exit",
)
#: the ones a probe cannot do without
REQUIRED_TRACEPOINTS = ("sched_switch", "sched_migrate_task", "sched_wakeup")

DOCTOR_INSTANCE_PREFIX = "harmony-doctor-"

#: the checks of :func:`doctor`, in the order :func:`format_doctor` prints them
CHECKS = (
    "root",
    "kernel",
    "scheduler",
    "sched_ext",
    "cpus",
    "topology",
    "isolation",
    "hz",
    "preemption",
    "cgroup",
    "release",
    "tracefs",
    "sched_tracepoints",
    "ftrace_print",
    "tracefs_instances",
    "trace_clocks",
    "sched_debug",
    "task_counters",
    "perf",
    "trace_cmd",
    "decoder",
    "memory",
)



def _read(path: Path) -> str | None:
    """The stripped text of a file, or None if it is missing or unreadable."""
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# CPUs and topology


def _cpus_text(cpus: list[int]) -> str:
    return format_cpulist(cpus) if cpus else "none"


def _llc_of(cache_dir: Path) -> tuple[dict | None, str | None]:
    """(LLC facts, None) for one CPU's cache/ directory, or (None, why not)."""
    if not cache_dir.is_dir():
        return None, "cache/"
    best = None
    for index in sorted(cache_dir.glob("index*")):
        level = _read_int(index / "level")
        ctype = _read(index / "type")
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
    return {"index": index.name, "level": best[0][0], "cpus": shared, "id": _read_int(index / "id")}, None


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


def topology(sysfs: str | Path = SYSFS) -> dict:
    """Per-online-CPU topology from sysfs plus counts and groupings.

    Returns ``{"cpus": [{"cpu", "package", "die", "core", "siblings", "llc_index", "llc_level",
    "llc_cpus", "llc_id", "node"}, ...], "counts": {"packages", "cores", "threads", "llcs",
    "numa_nodes"}, "groups": {"smt", "llc", "package", "numa"}, "smt_active", "notes"}``.
    A field sysfs does not provide is None, with a note naming the file and the CPUs concerned.
    """
    sysfs = Path(sysfs)
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

        package = field("physical_package_id", _read_int)
        core = field("core_id", _read_int)
        die = _read_int(topo / "die_id")  # only on kernels/arches that have dies; no note
        siblings = read_cpulist_file(topo / "core_cpus_list") or read_cpulist_file(topo / "thread_siblings_list")
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
    smt = _read(sysfs / "devices/system/cpu/smt/active")
    smt_active = {"1": True, "0": False}.get(smt) if smt is not None else None
    if smt_active is None and groups["smt"]:
        smt_active = any(len(g) > 1 for g in groups["smt"])
    return {"cpus": rows, "counts": counts, "groups": groups, "smt_active": smt_active, "notes": notes}


# --------------------------------------------------------------------------------------------
# kernel, scheduler, config


def is_root() -> bool:
    """Whether this process runs as root (tests monkeypatch this to simulate a user)."""
    return os.geteuid() == 0


def kernel_version(release: str | None = None) -> tuple[int, int] | None:
    """(major, minor) of a kernel release string such as ``"6.18.44-fc"``; None if unparsable."""
    release = os.uname().release if release is None else release
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else None


def sched_ext_state(root: str | Path = SCHED_EXT_DIR) -> dict:
    """``{"state": "not built" | <contents of state>, "ops": name or None, "switch_all": bool|None}``."""
    root = Path(root)
    state = _read(root / "state")
    if state is None:
        return {"state": "not built", "ops": None, "switch_all": None}
    ops = _read(root / "root/ops") or None
    switch_all = _read(root / "switch_all")
    return {"state": state, "ops": ops, "switch_all": {"1": True, "0": False}.get(switch_all)}


def scheduler_name(release: str | None = None, sched_ext_root: str | Path = SCHED_EXT_DIR) -> str:
    """The scheduler in charge of normal tasks: the sched_ext ops name when a BPF scheduler is
    enabled, else ``"EEVDF"`` on kernels >= 6.6 and ``"CFS"`` below."""
    scx = sched_ext_state(sched_ext_root)
    if scx["state"] == "enabled":
        return scx["ops"] or "sched_ext"
    version = kernel_version(release)
    if version is None:
        return "unknown"
    return "EEVDF" if version >= (6, 6) else "CFS"


def kernel_config(release: str | None = None) -> tuple[dict[str, str], str | None]:
    """({CONFIG_X: value}, source path) from /boot/config-<release> or /proc/config.gz."""
    release = os.uname().release if release is None else release
    text, source = None, None
    boot = Path(f"/boot/config-{release}")
    try:
        text, source = boot.read_text(errors="replace"), str(boot)
    except OSError:
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


# --------------------------------------------------------------------------------------------
# mounts and helpers


def _mounts() -> list[tuple[str, str, str]]:
    """(mountpoint, fstype, options) of every mount, from /proc/mounts."""
    out = []
    text = _read(PROC / "mounts") or ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])
            out.append((mnt, parts[2], parts[3]))
    return out


def _mountpoints(fstype: str) -> list[str]:
    return [m for m, t, _ in _mounts() if t == fstype]


def _mount(fstype: str, target: Path) -> tuple[bool, str]:
    """``mount -t fstype nodev target``; (succeeded, error line)."""
    if shutil.which("mount") is None:
        return False, "no mount command"
    try:
        r = subprocess.run(
            ["mount", "-t", fstype, "nodev", str(target)], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError) as e:
        return False, str(e)
    return r.returncode == 0, _first_line(r.stderr) if r.returncode else ""


def _first_line(text: str) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line
    return ""


def _run(argv: list[str], timeout: float = 5.0, cwd=None) -> tuple[int | None, str, str]:
    """(returncode or None on timeout/exec failure, stdout, stderr)."""
    try:
        r = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout:g} s"
    except OSError as e:
        return None, "", str(e)
    return r.returncode, r.stdout, r.stderr


# --------------------------------------------------------------------------------------------
# the checks


def _check(status: str, detail: str, **facts) -> dict:
    return {"status": status, "detail": detail, **facts}


def _check_root() -> dict:
    root = is_root()
    euid = os.geteuid()
    if root:
        return _check(OK, "running as root", root=True, euid=euid)
    return _check(WARN, f"euid {euid}: recording needs root", root=False, euid=euid)


def _check_kernel() -> dict:
    u = os.uname()
    v = kernel_version(u.release)
    return _check(
        OK if v else WARN,
        f"{u.sysname} {u.release} {u.machine}",
        release=u.release,
        version=list(v) if v else None,
        build=u.version,
        machine=u.machine,
    )


def _check_sched_ext() -> dict:
    scx = sched_ext_state()
    if scx["state"] == "not built":
        return _check(MISSING, "not built (no /sys/kernel/sched_ext)", **scx)
    detail = scx["state"]
    if scx["ops"]:
        detail += f", ops {scx['ops']}"
    if scx["state"] == "enabled" and scx["switch_all"] is False:
        detail += " (partial: only SCHED_EXT tasks)"
    return _check(OK, detail, **scx)


def _check_scheduler(release: str) -> dict:
    name = scheduler_name(release)
    scx = sched_ext_state()
    if scx["state"] == "enabled":
        why = "sched_ext BPF scheduler enabled"
    else:
        v = kernel_version(release)
        why = f"kernel {v[0]}.{v[1]} {'>=' if v >= (6, 6) else '<'} 6.6" if v else "kernel version unknown"
    return _check(OK if name != "unknown" else WARN, f"{name} ({why})", name=name)


def _check_cpus() -> dict:
    online = online_cpus()
    possible = read_cpulist_file(SYSFS / "devices/system/cpu/possible")
    affinity = sorted(os.sched_getaffinity(0))
    detail = f"online {_cpus_text(online)} ({len(online)}"
    detail += f" of {len(possible)} possible)" if possible else ")"
    status = OK
    if set(affinity) != set(online):
        status = WARN
        detail += f"; this process may only use {_cpus_text(affinity)}"
    return _check(status, detail, online=online, online_list=format_cpulist(online),
                  possible=possible, affinity=affinity, cpu_count=os.cpu_count())


def _check_topology() -> dict:
    topo = topology()
    c = topo["counts"]

    def n(key, word):
        v = c[key]
        return f"? {word}s" if v is None else f"{v} {word}{'' if v == 1 else 's'}"

    detail = ", ".join([n("packages", "package"), n("cores", "core"), n("threads", "thread"),
                        n("llcs", "LLC"), n("numa_nodes", "NUMA node")])
    if topo["smt_active"] is not None:
        detail += f"; SMT {'on' if topo['smt_active'] else 'off'}"
    return _check(WARN if topo["notes"] else OK, detail, **topo)


def _check_isolation() -> dict:
    cpu_dir = SYSFS / "devices/system/cpu"
    isolated = read_cpulist_file(cpu_dir / "isolated")
    nohz_full = read_cpulist_file(cpu_dir / "nohz_full")
    cmdline = _read(PROC / "cmdline") or ""
    args = {k: v for k, _, v in (a.partition("=") for a in cmdline.split()) if k in ("isolcpus", "nohz_full")}
    online = set(online_cpus())
    hit = sorted(online & (set(isolated or []) | set(nohz_full or [])))
    parts = [f"isolated {_cpus_text(isolated)}" if isolated is not None else "isolated ?"]
    parts.append(f"nohz_full {_cpus_text(nohz_full)}" if nohz_full is not None else "nohz_full not built")
    if hit:
        parts.append(f"balancer leaves {format_cpulist(hit)} alone")
    return _check(WARN if hit else OK, "; ".join(parts), isolated=isolated, nohz_full=nohz_full,
                  cmdline=args, isolated_online=hit)


def _check_hz(config: dict, source: str | None) -> dict:
    hz = config.get("CONFIG_HZ")
    try:
        hz = int(hz) if hz is not None else None
    except ValueError:
        hz = None
    if hz is None:
        why = f"no CONFIG_HZ in {source}" if source else "no /boot/config-<release> or /proc/config.gz"
        return _check(WARN, f"unknown ({why})", hz=None, source=source)
    return _check(OK, f"{hz} (from {source})", hz=hz, source=source)


_PREEMPT_CONFIG = (
    ("CONFIG_PREEMPT_RT", "rt"),
    ("CONFIG_PREEMPT_LAZY", "lazy"),
    ("CONFIG_PREEMPT", "full"),
    ("CONFIG_PREEMPT_VOLUNTARY", "voluntary"),
    ("CONFIG_PREEMPT_NONE", "none"),
)


def _check_preemption(debugfs: str | None, config: dict, source: str | None) -> dict:
    dynamic = config.get("CONFIG_PREEMPT_DYNAMIC") == "y" or "PREEMPT_DYNAMIC" in os.uname().version
    if debugfs:
        path = Path(debugfs) / "sched/preempt"
        text = _read(path)
        m = re.search(r"\((\w+)\)", text or "")
        if m:
            return _check(OK, f"{m.group(1)} (from {path}; choices: {text})", model=m.group(1),
                          dynamic=True, source=str(path))
    cmdline = _read(PROC / "cmdline") or ""
    m = re.search(r"(?:^|\s)preempt=(\w+)", cmdline)
    if m and dynamic:
        return _check(OK, f"{m.group(1)} (preempt= on the kernel command line)", model=m.group(1),
                      dynamic=True, source="/proc/cmdline")
    for key, model in _PREEMPT_CONFIG:
        if config.get(key) == "y":
            how = "boot default of a PREEMPT_DYNAMIC kernel" if dynamic else "built in"
            return _check(OK, f"{model} ({how}, from {source}; sched/preempt not readable)",
                          model=model, dynamic=dynamic, source=source)
    build = os.uname().version
    for word, model in (("PREEMPT_RT", "rt"), ("PREEMPT_DYNAMIC", None), ("PREEMPT", "full")):
        if word in build.split():
            return _check(WARN, f"{model or 'dynamic, current mode unknown'} (from uname -v)",
                          model=model, dynamic=dynamic, source="uname -v")
    return _check(MISSING, "not visible (no sched/preempt, kernel config or uname hint)",
                  model=None, dynamic=dynamic, source=None)


def _check_release(sched_ext: dict, cpus: dict) -> dict:
    """How a run here releases its tasks at t0 (:mod:`harmony.controller`): ``occupied`` where it
    can be (SCHED_FIFO occupiers hold the other CPUs while the tasks wake), else ``confined``."""
    from harmony.controller import ControllerError, confined_why, release_options
    try:
        _, mode = release_options()
    except ControllerError as exc:
        return _check(WARN, f"{exc}: runs will refuse it", mode=None)
    online = cpus.get("online", [])
    why = confined_why(mode, True, online[1:], sched_ext.get("state"))
    if why is None:
        # the occupiers and the controller run as SCHED_FIFO: try it on this thread, put it back
        before, param = os.sched_getscheduler(0), os.sched_getparam(0)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError as exc:
            why = f"SCHED_FIFO not permitted ({exc.strerror})"
        else:
            os.sched_setscheduler(0, before, param)
    if why:
        return _check(OK, f"confined (woken on their initial CPU, then freed): {why}",
                      mode="confined", why=why)
    return _check(OK, "occupied: SCHED_FIFO occupiers hold the other CPUs while each CPU's tasks "
                      "wake, already free", mode="occupied", why=None)


def _check_cgroup() -> dict:
    mounts = _mounts()
    v2 = [m for m, t, _ in mounts if t == "cgroup2"]
    v1_cpuset = [m for m, t, o in mounts if t == "cgroup" and "cpuset" in o.split(",")]
    # the release holds each initial CPU's tasks in a cpuset cgroup (harmony/cpuset.py): v2
    # preferred, v1 works; without either it pins every task (slower release, noted in runs)
    if not v2:
        detail = "cgroup2 not mounted"
        if v1_cpuset:
            detail += f"; cpuset on cgroup v1 at {v1_cpuset[0]}: the release uses it"
        else:
            detail += "; no cpuset: the release pins each task instead (slower)"
        return _check(OK if v1_cpuset else MISSING, detail, v2_mounted=False, v2_path=None,
                      unified=False, controllers=[], cpuset_v2=False,
                      cpuset_v1=v1_cpuset[0] if v1_cpuset else None)
    path = "/sys/fs/cgroup" if "/sys/fs/cgroup" in v2 else v2[0]
    unified = path == "/sys/fs/cgroup"
    controllers = (_read(Path(path) / "cgroup.controllers") or "").split()
    cpuset = "cpuset" in controllers
    detail = f"cgroup2 at {path}" + ("" if unified else " (hybrid)")
    if cpuset:
        detail += "; cpuset available: the release uses it"
    elif v1_cpuset:
        detail += f"; cpuset bound to v1 at {v1_cpuset[0]}: the release uses that"
    else:
        detail += "; no cpuset controller: the release pins each task instead (slower)"
    return _check(OK if cpuset or v1_cpuset else WARN, detail, v2_mounted=True, v2_path=path, unified=unified,
                  controllers=controllers, cpuset_v2=cpuset, cpuset_v1=v1_cpuset[0] if v1_cpuset else None)


def _check_tracefs(mount: bool) -> dict:
    points = _mountpoints("tracefs")
    if points:
        path = str(TRACEFS_DEFAULT) if str(TRACEFS_DEFAULT) in points else points[0]
        return _check(OK, f"{path} (mounted)", path=path, mounted=True, mounted_by_doctor=False)
    error = ""
    if mount and is_root() and TRACEFS_DEFAULT.is_dir():
        done, error = _mount("tracefs", TRACEFS_DEFAULT)
        if done and str(TRACEFS_DEFAULT) in _mountpoints("tracefs"):
            return _check(OK, f"{TRACEFS_DEFAULT} (mounted it now)", path=str(TRACEFS_DEFAULT),
                          mounted=True, mounted_by_doctor=True)
    # A mounted debugfs exposes tracefs under tracing/ (automounted on first access).
    if (TRACEFS_LEGACY / "events").is_dir():
        return _check(OK, f"{TRACEFS_LEGACY} (via debugfs)", path=str(TRACEFS_LEGACY), mounted=True,
                      mounted_by_doctor=False)
    if not TRACEFS_DEFAULT.is_dir():
        why = f"{TRACEFS_DEFAULT} does not exist (kernel without tracing?)"
    elif error:
        why = f"mount failed: {error}"
    elif not is_root():
        why = "not mounted (root could mount it)"
    else:
        why = "not mounted"
    return _check(MISSING, why, path=None, mounted=False, mounted_by_doctor=False)


def _check_tracepoints(tracefs: str | None) -> tuple[dict, dict]:
    if not tracefs:
        na = _check(MISSING, "tracefs not mounted", present=[], missing=list(SCHED_TRACEPOINTS))
        return na, _check(MISSING, "tracefs not mounted", present=False)
    events = Path(tracefs) / "events"
    try:
        os.listdir(events)
    except PermissionError:
        na = _check(WARN, f"{events} not readable (need root)", present=[], missing=list(SCHED_TRACEPOINTS))
        return na, _check(WARN, f"{events} not readable (need root)", present=False)
    except OSError as e:
        na = _check(MISSING, f"{events}: {e.strerror}", present=[], missing=list(SCHED_TRACEPOINTS))
        return na, _check(MISSING, f"{events}: {e.strerror}", present=False)
    present = [t for t in SCHED_TRACEPOINTS if (events / "sched" / t / "format").exists()]
    missing = [t for t in SCHED_TRACEPOINTS if t not in present]
    missing_required = [t for t in REQUIRED_TRACEPOINTS if t in missing]
    if missing_required:
        status, detail = MISSING, "missing " + ", ".join(missing)
    elif missing:
        status, detail = WARN, f"{len(present)}/{len(SCHED_TRACEPOINTS)}; missing " + ", ".join(missing)
    else:
        status, detail = OK, f"all {len(SCHED_TRACEPOINTS)}: " + " ".join(t.removeprefix("sched_") for t in present)
    tp = _check(status, detail, present=present, missing=missing)
    has_print = (events / "ftrace/print/format").exists()
    has_marker = (Path(tracefs) / "trace_marker").exists()
    if has_print and has_marker:
        fp = _check(OK, "ftrace:print + trace_marker (markers)", present=True, trace_marker=True)
    else:
        what = "ftrace:print" if not has_print else "trace_marker"
        fp = _check(MISSING, f"no {what}: no markers in the trace", present=has_print, trace_marker=has_marker)
    return tp, fp


def _reclaim_doctor_instances(instances: Path) -> list[str]:
    """Remove harmony-doctor-<pid> instances whose process is gone; return their names."""
    removed = []
    try:
        entries = list(instances.iterdir())
    except OSError:
        return removed
    for d in entries:
        suffix = d.name.removeprefix(DOCTOR_INSTANCE_PREFIX)
        if d.name.startswith(DOCTOR_INSTANCE_PREFIX) and suffix.isdigit() and not pid_alive(int(suffix)):
            try:
                d.rmdir()
                removed.append(d.name)
            except OSError:
                pass
    return removed


def _check_instances(tracefs: str | None) -> dict:
    if not tracefs:
        return _check(MISSING, "tracefs not mounted", creatable=False, reclaimed=[])
    instances = Path(tracefs) / "instances"
    try:
        os.listdir(instances)
    except FileNotFoundError:
        return _check(MISSING, f"no {instances} (kernel too old?)", creatable=False, reclaimed=[])
    except OSError as e:
        hint = " (need root)" if not is_root() else ""
        return _check(WARN, f"{instances}: {e.strerror or e}{hint}", creatable=False, reclaimed=[])
    reclaimed = _reclaim_doctor_instances(instances)
    inst = instances / f"{DOCTOR_INSTANCE_PREFIX}{os.getpid()}"
    created = False
    error = None
    has_sched = False
    removed = True
    try:
        inst.mkdir()
        created = True
        has_sched = (inst / "events/sched/sched_switch/enable").exists()
    except OSError as e:
        error = e.strerror or str(e)
    finally:
        if created:
            removed = False
            for attempt in range(20):
                try:
                    inst.rmdir()
                    removed = True
                    break
                except FileNotFoundError:
                    removed = True
                    break
                except OSError:
                    time.sleep(0.05 * (attempt + 1))
    facts = dict(creatable=created, removed=removed, sched_events=has_sched, reclaimed=reclaimed,
                 path=str(instances))
    if not created:
        hint = " (need root)" if not is_root() else ""
        return _check(WARN if not is_root() else MISSING, f"cannot create: {error}{hint}", **facts)
    if not removed:
        return _check(WARN, f"created but could not remove {inst}", **facts)
    if not has_sched:
        return _check(WARN, "creatable, but without events/sched", **facts)
    return _check(OK, "create + remove works", **facts)


def _check_clocks(tracefs: str | None) -> dict:
    text = _read(Path(tracefs) / "trace_clock") if tracefs else None
    if text is None:
        if tracefs and not is_root():
            return _check(WARN, "trace_clock not readable (need root)", available=[], current=None)
        return _check(MISSING, "trace_clock not readable", available=[], current=None)
    available = [c.strip("[]") for c in text.split()]
    current = next((c.strip("[]") for c in text.split() if c.startswith("[")), None)
    monotonic = [c for c in ("mono", "boot") if c in available]
    status = OK if monotonic else WARN
    detail = " ".join(available) + f" (current {current})"
    if not monotonic:
        detail += "; no mono/boot clock to match user space"
    return _check(status, detail, available=available, current=current)


def _check_sched_debug(mount: bool) -> dict:
    mounted_by_doctor = False
    points = _mountpoints("debugfs")
    error = ""
    if not points and mount and is_root() and DEBUGFS_DEFAULT.is_dir():
        done, error = _mount("debugfs", DEBUGFS_DEFAULT)
        points = _mountpoints("debugfs")
        mounted_by_doctor = done and bool(points)
    debugfs = str(DEBUGFS_DEFAULT) if str(DEBUGFS_DEFAULT) in points else (points[0] if points else None)
    candidates = ([Path(debugfs) / "sched/debug"] if debugfs else []) + [PROC / "sched_debug"]
    online = online_cpus()
    tried = []
    for path in candidates:
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            continue
        except OSError as e:
            tried.append(f"{path}: {e.strerror or e}")
            continue
        per_cpu: dict[int, int] = {}
        cpu = None
        for line in text.splitlines():
            m = re.match(r"cpu#(\d+)", line)
            if m:
                cpu = int(m.group(1))
                continue
            if cpu is not None and not line.startswith(" "):
                if line.strip():
                    cpu = None  # left the per-CPU header block (e.g. cfs_rq[..])
                continue
            m = re.match(r"\s+\.nr_running\s*:\s*(\d+)", line)
            if cpu is not None and m and cpu not in per_cpu:
                per_cpu[cpu] = int(m.group(1))
        shows = bool(online) and all(c in per_cpu for c in online)
        detail = f"{path} readable; nr_running for {'every online CPU' if shows else 'CPUs ' + _cpus_text(sorted(per_cpu))}"
        if mounted_by_doctor:
            detail += " (mounted debugfs now)"
        return _check(OK if shows else WARN, detail, path=str(path), readable=True,
                      nr_running_per_cpu=shows, debugfs=debugfs, debugfs_mounted_by_doctor=mounted_by_doctor)
    if tried:
        why = "; ".join(tried)
    elif debugfs is None:
        why = "debugfs not mounted" + (f" (mount failed: {error})" if error else "") + ", no /proc/sched_debug"
    else:
        why = "no sched/debug in debugfs (CONFIG_SCHED_DEBUG off?), no /proc/sched_debug"
    return _check(WARN if tried else MISSING, why, path=None, readable=False, nr_running_per_cpu=False,
                  debugfs=debugfs, debugfs_mounted_by_doctor=mounted_by_doctor)


def _check_task_counters() -> dict:
    from harmony.probes import proc_sched
    ok, why = proc_sched.available()
    if ok:
        return _check(OK, "/proc/<pid>/sched prints se.nr_migrations, nr_switches and "
                          "se.sum_exec_runtime: each run's trace is checked against them",
                      readable=True)
    return _check(WARN, why + "; runs are not checked against the tasks' own counters",
                  readable=False)


def _perf_record_test(perf: str, events: list[str]) -> tuple[bool, str, float]:
    """Record ``events`` system-wide for 10 ms into a temp dir; (permitted, error line, seconds)."""
    fast = ["-N", "-B", "--no-bpf-event", "--synth=no"]  # skip build-id and synthesis: ~0.3 s
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="harmony-doctor-") as tmp:
        argv_tail = ["-a", "-o", os.path.join(tmp, "perf.data"), "--", "sleep", "0.01"]
        ev = [a for e in events for a in ("-e", f"sched:{e}")]
        rc, _, err = _run([perf, "record", "-q", *fast, *ev, *argv_tail], timeout=5.0, cwd=tmp)
        if rc == 129 or (rc and "unknown option" in err.lower()):  # older perf: fewer options
            rc, _, err = _run([perf, "record", "-q", "-N", "-B", *ev, *argv_tail], timeout=5.0, cwd=tmp)
    elapsed = time.monotonic() - t0
    if rc == 0:
        return True, "", elapsed
    lines = [ln.strip() for ln in err.splitlines() if ln.strip() and not ln.strip().startswith("[")]
    error = next((ln for ln in lines if "rror" in ln or "ermission" in ln or "denied" in ln), None)
    return False, error or (lines[0] if lines else f"exit status {rc}"), elapsed


def _check_perf(tracepoints: dict, test_record: bool = True) -> dict:
    paranoid = _read_int(PROC / "sys/kernel/perf_event_paranoid")
    perf = shutil.which("perf")
    base = dict(present=False, path=perf, version=None, paranoid=paranoid, can_record_sched=False,
                events_tested=[], test_s=None, error=None)
    if not perf:
        return _check(MISSING, "perf not installed", **base)
    rc, out, err = _run([perf, "--version"])
    m = re.search(r"version\s+(\S+)", out)
    if rc != 0 or not m:
        why = _first_line(err) or _first_line(out) or f"exit status {rc}"
        return _check(WARN, f"{perf} does not run: {why}", **{**base, "error": why})
    base.update(present=True, version=m.group(1))
    if not test_record:
        return _check(OK, f"{m.group(1)}; recording not tested (perf does not record in this run)",
                      **base)
    events = [t for t in REQUIRED_TRACEPOINTS if t in tracepoints.get("present", [])] or ["sched_switch"]
    ok, error, elapsed = _perf_record_test(perf, events)
    if not ok and not is_root():
        error += " (need root?)"
    base.update(can_record_sched=ok, events_tested=events, test_s=round(elapsed, 3), error=error or None)
    if ok:
        return _check(OK, f"{m.group(1)}; record -e sched:* permitted (paranoid {paranoid})", **base)
    return _check(WARN, f"{m.group(1)}; record -e sched:* refused (paranoid {paranoid}): {error}", **base)


def _check_trace_cmd() -> dict:
    exe = shutil.which("trace-cmd")
    base = dict(present=False, path=exe, version=None, ftrace_enabled_writable=None)
    if not exe:
        return _check(MISSING, "trace-cmd not installed (optional)", **base)
    rc, out, err = _run([exe, "--version"])
    m = re.search(r"version\s+(\S+)", out + "\n" + err)
    base.update(present=True, version=m.group(1) if m else None)
    detail = m.group(1) if m else "version unknown"
    # trace-cmd record writes /proc/sys/kernel/ftrace_enabled; write back its current value to see.
    knob = PROC / "sys/kernel/ftrace_enabled"
    current = _read(knob)
    if current is not None and is_root():
        try:
            fd = os.open(knob, os.O_WRONLY)
            try:
                os.write(fd, current.encode())
                base["ftrace_enabled_writable"] = True
            finally:
                os.close(fd)
        except OSError:
            base["ftrace_enabled_writable"] = False
    if base["ftrace_enabled_writable"] is False:
        return _check(WARN, f"{detail}; `trace-cmd record` would fail: {knob} not writable", **base)
    return _check(OK, detail + " (optional)", **base)


def _check_decoder() -> dict:
    """Which trace decoder runs here: the compiled kernels (numba) or the numpy fallback."""
    from harmony import jit
    ok, detail = jit.describe()
    return _check(OK if ok else WARN, detail, numba=jit.numba_version(), mode=jit.mode())


def _check_memory() -> dict:
    """Whether a decode's memory is faulted in ahead of it (harmony.memory.prefault_heap)."""
    import harmony.probes  # noqa: F401  (importing the probes sets malloc's parameters)
    from harmony import memory
    ok, detail = memory.describe()
    return _check(OK if ok else WARN, detail, prefault=ok)


# --------------------------------------------------------------------------------------------
# doctor


def _guarded(name: str, fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # a check must not take the doctor down with it
        return _check(WARN, f"check failed: {type(e).__name__}: {e}".splitlines()[0], error=str(e))


def _verdict(facts: dict) -> dict:
    unavailable: dict[str, str] = {}
    tp = facts["sched_tracepoints"]
    missing_req = [t for t in REQUIRED_TRACEPOINTS if t not in tp.get("present", [])]

    tracefs_ok = False
    if not facts["tracefs"].get("mounted"):
        unavailable["tracefs"] = f"tracefs: {facts['tracefs']['detail']}"
    elif missing_req:
        unavailable["tracefs"] = f"tracefs: {tp['detail']}"
    elif not facts["tracefs_instances"].get("creatable") or not facts["tracefs_instances"].get("sched_events"):
        unavailable["tracefs"] = f"tracefs instances: {facts['tracefs_instances']['detail']}"
    else:
        tracefs_ok = True

    perf_ok = False
    perf = facts["perf"]
    if not perf.get("can_record_sched"):
        unavailable["perf"] = f"perf: {perf['detail']}"
    elif missing_req:
        unavailable["perf"] = f"perf: {tp['detail']}"
    else:
        perf_ok = True

    probes = [p for p, ok in (("tracefs", tracefs_ok), ("perf", perf_ok)) if ok]
    root = facts["root"].get("root", False)
    can_run = root and bool(probes)
    reasons = []
    if not can_run:
        if not root:
            reasons.append(f"not running as root (euid {facts['root'].get('euid')}): recording needs root")
        reasons += [unavailable[p] for p in ("tracefs", "perf") if p in unavailable]
    return {"can_run": can_run, "probes": probes, "reasons": reasons, "unavailable": unavailable}


def doctor(mount: bool = True, test_perf: bool = True) -> dict:
    """Detect what this host can do; return JSON-serialisable facts (see the module docstring).

    ``mount``: as root, mount tracefs (and debugfs) if they are not mounted. ``test_perf``: try a
    10 ms ``perf record`` (~0.3 s); without it, perf is only found, and not a usable probe. Keys: one per name in
    :data:`CHECKS`, plus ``verdict`` = ``{"can_run", "probes", "reasons", "unavailable"}``,
    ``online_cpus``, ``scheduler`` name shortcut inside ``scheduler["name"]``, ``notes`` and
    ``elapsed_s``. ``can_run`` is true when running as root and at least one probe (a tracefs
    instance with sched_switch, sched_migrate_task and sched_wakeup, or perf recording sched
    tracepoints) can record.
    """
    t0 = time.monotonic()
    release = os.uname().release
    config, config_source = kernel_config(release)
    facts: dict = {}
    facts["root"] = _guarded("root", _check_root)
    facts["kernel"] = _guarded("kernel", _check_kernel)
    facts["scheduler"] = _guarded("scheduler", _check_scheduler, release)
    facts["sched_ext"] = _guarded("sched_ext", _check_sched_ext)
    facts["cpus"] = _guarded("cpus", _check_cpus)
    facts["topology"] = _guarded("topology", _check_topology)
    facts["isolation"] = _guarded("isolation", _check_isolation)
    facts["hz"] = _guarded("hz", _check_hz, config, config_source)
    facts["cgroup"] = _guarded("cgroup", _check_cgroup)
    facts["release"] = _guarded("release", _check_release, facts["sched_ext"], facts["cpus"])
    facts["tracefs"] = _guarded("tracefs", _check_tracefs, mount)
    tracefs = facts["tracefs"].get("path")
    tp_fp = _guarded("sched_tracepoints", _check_tracepoints, tracefs)
    if isinstance(tp_fp, tuple):
        facts["sched_tracepoints"], facts["ftrace_print"] = tp_fp
    else:
        facts["sched_tracepoints"] = facts["ftrace_print"] = tp_fp
    facts["tracefs_instances"] = _guarded("tracefs_instances", _check_instances, tracefs)
    facts["trace_clocks"] = _guarded("trace_clocks", _check_clocks, tracefs)
    facts["sched_debug"] = _guarded("sched_debug", _check_sched_debug, mount)
    facts["task_counters"] = _guarded("task_counters", _check_task_counters)
    facts["preemption"] = _guarded("preemption", _check_preemption, facts["sched_debug"].get("debugfs"),
                                   config, config_source)
    facts["perf"] = _guarded("perf", _check_perf, facts["sched_tracepoints"], test_perf)
    facts["trace_cmd"] = _guarded("trace_cmd", _check_trace_cmd)
    facts["decoder"] = _guarded("decoder", _check_decoder)
    facts["memory"] = _guarded("memory", _check_memory)
    facts = {name: facts[name] for name in CHECKS}  # stable order
    facts["online_cpus"] = facts["cpus"].get("online", [])
    facts["verdict"] = _verdict(facts)
    notes = []
    if facts["tracefs"].get("mounted_by_doctor"):
        notes.append(f"mounted tracefs at {facts['tracefs']['path']}")
    if facts["sched_debug"].get("debugfs_mounted_by_doctor"):
        notes.append(f"mounted debugfs at {facts['sched_debug']['debugfs']}")
    if facts["tracefs_instances"].get("reclaimed"):
        notes.append("removed stale instances: " + ", ".join(facts["tracefs_instances"]["reclaimed"]))
    notes += facts["topology"].get("notes", [])
    facts["notes"] = notes
    facts["elapsed_s"] = round(time.monotonic() - t0, 3)
    return facts


def format_doctor(facts: dict) -> str:
    """Render :func:`doctor` facts as an aligned table (check, status, detail) plus the verdict."""
    rows = [(name, facts[name].get("status", "?"), facts[name].get("detail", "")) for name in CHECKS if name in facts]
    v = facts.get("verdict", {})
    if v:
        if v.get("can_run"):
            rows.append(("verdict", OK, "can run; probes: " + ", ".join(v.get("probes", []))))
        else:
            rows.append(("verdict", MISSING, "cannot run"))
    w1 = max(len("CHECK"), *(len(r[0]) for r in rows))
    w2 = max(len("STATUS"), *(len(r[1]) for r in rows))
    lines = [f"{'CHECK':<{w1}}  {'STATUS':<{w2}}  DETAIL"]
    lines += [f"{name:<{w1}}  {status:<{w2}}  {detail}".rstrip() for name, status, detail in rows]
    indent = " " * (w1 + w2 + 4)
    for reason in v.get("reasons", []):
        lines.append(f"{indent}- {reason}")
    if v.get("can_run"):
        for probe, reason in v.get("unavailable", {}).items():
            lines.append(f"{indent}- {probe} unavailable: {reason.split(': ', 1)[-1]}")
    for note in facts.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)
