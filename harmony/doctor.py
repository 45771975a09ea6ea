"""``harmony doctor``: what this host can do, checked one facility at a time, and a verdict.

:func:`doctor` returns JSON-serialisable facts, one check per name in :data:`CHECKS`, and
:func:`format_doctor` renders them as a compact table. The facts about the host come from
:mod:`harmony.hostfacts` (pure reads); the checks here word them. The rest is answered by who
knows it: each recording probe of :data:`harmony.probes.PROBES` its own check
(``Probe.doctor_check``) and whether it can record (``Probe.cannot_record``), the samplers of the
kernel's own view theirs (:func:`harmony.probes.sched_debug.doctor_check`,
:func:`harmony.probes.proc_sched.doctor_check`), the controller how a run releases its tasks
(:func:`harmony.workload.controller.release_check`).

:func:`doctor` leaves no kernel state behind: the tracefs instance the tracefs probe's check
creates is removed at once, and no event is ever enabled in tracefs (the perf check enables
tracepoints only for the lifetime of a ~0.3 s ``perf record``). The one lasting change it may make
is mounting tracefs/debugfs when they are not mounted and it runs as root; the facts say so
(``mounted_by_doctor``).

Each check is a dict with at least ``status`` (``ok``, ``warn`` or ``missing``) and ``detail``
(one line for humans); the other keys are the machine-readable facts
(:func:`harmony.hostfacts.check`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from harmony import hostfacts
from harmony.core import jit, memory
from harmony.core.osutil import format_cpulist, online_cpus
from harmony.core.wording import plural
from harmony.hostfacts import MISSING, OK, WARN, check
from harmony.probes import PROBES, domains, get_probe, proc_sched, sched_debug
from harmony.probes.base import REQUIRED_TRACEPOINTS
from harmony.probes.schema import SCHED_EVENTS
from harmony.vm import kernels
from harmony.vm.machine import doctor_check as vm_check
from harmony.workload.controller import release_check

#: the checks of :func:`doctor`, in the order :func:`format_doctor` prints them (a probe's check
#: that is not named here comes after them)
CHECKS = (
    "root",
    "kernel",
    "scheduler",
    "sched_ext",
    "cpus",
    "topology",
    "sched_domains",
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
    "pyperf",
    "trace_cmd",
    "decoder",
    "memory",
)


def _cpus_text(cpus: list[int]) -> str:
    return format_cpulist(cpus) if cpus else "none"


def _first_line(text: str) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line
    return ""


def _run(argv: list[str], timeout: float = 5.0) -> tuple[int | None, str, str]:
    """(returncode or None on timeout/exec failure, stdout, stderr)."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout:g} s"
    except OSError as e:
        return None, "", str(e)
    return r.returncode, r.stdout, r.stderr


def _mount(fstype: str, target: Path) -> tuple[bool, str]:
    """``mount -t fstype nodev target``; (succeeded, error line)."""
    if shutil.which("mount") is None:
        return False, "no mount command"
    try:
        r = subprocess.run(
            ["mount", "-t", fstype, "nodev", str(target)], capture_output=True, text=True,
            timeout=10
        )
    except (OSError, subprocess.SubprocessError) as e:
        return False, str(e)
    return r.returncode == 0, _first_line(r.stderr) if r.returncode else ""


# --------------------------------------------------------------------------------------------
# the checks of the host


def check_root() -> dict:
    euid = os.geteuid()
    if hostfacts.is_root():
        return check(OK, "running as root", root=True, euid=euid)
    return check(WARN, f"euid {euid}: recording needs root", root=False, euid=euid)


def check_kernel() -> dict:
    u = os.uname()
    v = hostfacts.kernel_version(u.release)
    return check(
        OK if v else WARN,
        f"{u.sysname} {u.release} {u.machine}",
        release=u.release,
        version=list(v) if v else None,
        build=u.version,
        machine=u.machine,
    )


def check_sched_ext() -> dict:
    scx = hostfacts.sched_ext_state()
    if scx["state"] == "not built":
        return check(MISSING, "not built (no /sys/kernel/sched_ext): --scx runs in a VM booting "
                              "--kernel sched-ext (harmony kernel list)", **scx)
    detail = scx["state"]
    if scx["ops"]:
        detail += f", ops {scx['ops']}"
    if scx["state"] == "enabled" and scx["switch_all"] is False:
        detail += " (partial: only SCHED_EXT tasks)"
    if scx["state"] == "enabled":
        detail += "; --scx refuses to start another (stop this one first)"
    return check(OK, detail, **scx)


def check_scheduler(release: str) -> dict:
    name = hostfacts.scheduler_name(release)
    if hostfacts.sched_ext_state()["state"] == "enabled":
        why = "sched_ext BPF scheduler enabled"
    else:
        v = hostfacts.kernel_version(release)
        why = (f"kernel {v[0]}.{v[1]} {'>=' if v >= (6, 6) else '<'} 6.6" if v
               else "kernel version unknown")
    return check(OK if name != "unknown" else WARN, f"{name} ({why})", name=name)


def check_cpus() -> dict:
    online = online_cpus()
    possible = hostfacts.possible_cpus()
    affinity = sorted(os.sched_getaffinity(0))
    detail = f"online {_cpus_text(online)} ({len(online)}"
    detail += f" of {len(possible)} possible)" if possible else ")"
    status = OK
    if set(affinity) != set(online):
        status = WARN
        detail += f"; this process may only use {_cpus_text(affinity)}"
    return check(status, detail, online=online, online_list=format_cpulist(online),
                 possible=possible, affinity=affinity, cpu_count=os.cpu_count())


def check_topology() -> dict:
    topo = hostfacts.topology()
    c = topo["counts"]

    def n(key, word):
        v = c[key]
        return f"? {word}s" if v is None else plural(v, word)

    detail = ", ".join([n("packages", "package"), n("cores", "core"), n("threads", "thread"),
                        n("llcs", "LLC"), n("numa_nodes", "NUMA node")])
    if topo["smt_active"] is not None:
        detail += f"; SMT {'on' if topo['smt_active'] else 'off'}"
    return check(WARN if topo["notes"] else OK, detail, **topo)


def check_sched_domains() -> dict:
    """The kernel's scheduling domains (:func:`harmony.probes.domains.read`: debugfs, with
    sched/verbose on for the read where the kernel needs it and back after, and
    /proc/schedstat): each level's name, span and parameters; warn where they cannot be read
    (the runs then carry no level per migration)."""
    topo = domains.read()
    lines = domains.describe(topo)
    if not topo["domains"]:
        why = "; ".join(topo["source"]["missing"]) or "no domains"
        return check(WARN, f"not readable: {why}", lines=[], **topo)
    detail = domains.summary_line(topo)
    if topo["source"]["missing"]:
        detail += f" (not read: {'; '.join(topo['source']['missing'])})"
    return check(OK, detail, lines=lines, **topo)


def check_isolation() -> dict:
    iso = hostfacts.isolation()
    isolated, nohz_full = iso["isolated"], iso["nohz_full"]
    hit = sorted(set(online_cpus()) & (set(isolated or []) | set(nohz_full or [])))
    parts = [f"isolated {_cpus_text(isolated)}" if isolated is not None else "isolated ?"]
    parts.append(f"nohz_full {_cpus_text(nohz_full)}" if nohz_full is not None
                 else "nohz_full not built")
    if hit:
        parts.append(f"balancer leaves {format_cpulist(hit)} alone")
    return check(WARN if hit else OK, "; ".join(parts), isolated=isolated, nohz_full=nohz_full,
                 cmdline=iso["cmdline"], isolated_online=hit)


def check_hz(config: dict, source: str | None) -> dict:
    hz = hostfacts.config_hz(config)
    if hz is None:
        why = (f"no CONFIG_HZ in {source}" if source
               else "no /boot/config-<release> or /proc/config.gz")
        return check(WARN, f"unknown ({why})", hz=None, source=source)
    return check(OK, f"{hz} (from {source})", hz=hz, source=source)


def check_preemption(debugfs: str | None, config: dict, source: str | None) -> dict:
    p = hostfacts.preemption(debugfs, config, source)
    model, seen_in = p["model"], p["seen_in"]
    facts = dict(model=model, dynamic=p["dynamic"], source=p["source"])
    if seen_in == "sched/preempt":
        return check(OK, f"{model} (from {p['source']}; choices: {p['choices']})", **facts)
    if seen_in == "cmdline":
        return check(OK, f"{model} (preempt= on the kernel command line)", **facts)
    if seen_in == "config":
        how = "boot default of a PREEMPT_DYNAMIC kernel" if p["dynamic"] else "built in"
        return check(OK, f"{model} ({how}, from {source}; sched/preempt not readable)", **facts)
    if seen_in == "uname":
        return check(WARN, f"{model or 'dynamic, current mode unknown'} (from uname -v)", **facts)
    return check(MISSING, "not visible (no sched/preempt, kernel config or uname hint)", **facts)


def check_cgroup() -> dict:
    v2, v1_cpuset = hostfacts.cgroup_mounts()
    # the release holds each initial CPU's tasks in a cpuset cgroup (harmony/workload/cpuset.py): v2
    # preferred, v1 works; without either it pins every task (slower release, noted in runs)
    if not v2:
        detail = "cgroup2 not mounted"
        if v1_cpuset:
            detail += f"; cpuset on cgroup v1 at {v1_cpuset[0]}: the release uses it"
        else:
            detail += "; no cpuset: the release pins each task instead (slower)"
        return check(OK if v1_cpuset else MISSING, detail, v2_mounted=False, v2_path=None,
                     unified=False, controllers=[], cpuset_v2=False,
                     cpuset_v1=v1_cpuset[0] if v1_cpuset else None)
    path = "/sys/fs/cgroup" if "/sys/fs/cgroup" in v2 else v2[0]
    unified = path == "/sys/fs/cgroup"
    controllers = hostfacts.cgroup_controllers(path)
    cpuset = "cpuset" in controllers
    detail = f"cgroup2 at {path}" + ("" if unified else " (hybrid)")
    if cpuset:
        detail += "; cpuset available: the release uses it"
    elif v1_cpuset:
        detail += f"; cpuset bound to v1 at {v1_cpuset[0]}: the release uses that"
    else:
        detail += "; no cpuset controller: the release pins each task instead (slower)"
    return check(OK if cpuset or v1_cpuset else WARN, detail, v2_mounted=True, v2_path=path,
                 unified=unified, controllers=controllers, cpuset_v2=cpuset,
                 cpuset_v1=v1_cpuset[0] if v1_cpuset else None)


def check_tracefs(mount: bool) -> dict:
    """Where tracefs is mounted; as root and with ``mount``, mounts it where it is not."""
    default, legacy = hostfacts.TRACEFS_DEFAULT, hostfacts.TRACEFS_LEGACY
    points = hostfacts.mountpoints("tracefs")
    if points:
        path = str(default) if str(default) in points else points[0]
        return check(OK, f"{path} (mounted)", path=path, mounted=True, mounted_by_doctor=False)
    error = ""
    if mount and hostfacts.is_root() and default.is_dir():
        done, error = _mount("tracefs", default)
        if done and str(default) in hostfacts.mountpoints("tracefs"):
            return check(OK, f"{default} (mounted it now)", path=str(default),
                         mounted=True, mounted_by_doctor=True)
    # A mounted debugfs exposes tracefs under tracing/ (automounted on first access).
    if (legacy / "events").is_dir():
        return check(OK, f"{legacy} (via debugfs)", path=str(legacy), mounted=True,
                     mounted_by_doctor=False)
    if not default.is_dir():
        why = f"{default} does not exist (kernel without tracing?)"
    elif error:
        why = f"mount failed: {error}"
    elif not hostfacts.is_root():
        why = "not mounted (root could mount it)"
    else:
        why = "not mounted"
    return check(MISSING, why, path=None, mounted=False, mounted_by_doctor=False)


def check_tracepoints(tracefs: str | None) -> tuple[dict, dict]:
    """The ``sched_tracepoints`` check (the sched events the probes record, :data:`SCHED_EVENTS`)
    and the ``ftrace_print`` check (what markers need)."""
    if not tracefs:
        na = check(MISSING, "tracefs not mounted", present=[], missing=list(SCHED_EVENTS))
        return na, check(MISSING, "tracefs not mounted", present=False)
    events = Path(tracefs) / "events"
    try:
        present = hostfacts.tracepoints(tracefs, "sched", SCHED_EVENTS)
    except PermissionError:
        na = check(WARN, f"{events} not readable (need root)", present=[],
                   missing=list(SCHED_EVENTS))
        return na, check(WARN, f"{events} not readable (need root)", present=False)
    except OSError as e:
        na = check(MISSING, f"{events}: {e.strerror}", present=[], missing=list(SCHED_EVENTS))
        return na, check(MISSING, f"{events}: {e.strerror}", present=False)
    missing = [t for t in SCHED_EVENTS if t not in present]
    missing_required = [t for t in REQUIRED_TRACEPOINTS if t in missing]
    if missing_required:
        status, detail = MISSING, "missing " + ", ".join(missing)
    elif missing:
        status, detail = WARN, f"{len(present)}/{len(SCHED_EVENTS)}; missing " + ", ".join(missing)
    else:
        status, detail = OK, (f"all {len(SCHED_EVENTS)}: "
                              + " ".join(t.removeprefix("sched_") for t in present))
    tp = check(status, detail, present=present, missing=missing)
    has_print, has_marker = hostfacts.markers(tracefs)
    if has_print and has_marker:
        fp = check(OK, "ftrace:print + trace_marker (markers)", present=True, trace_marker=True)
    else:
        what = "ftrace:print" if not has_print else "trace_marker"
        fp = check(MISSING, f"no {what}: no markers in the trace", present=has_print,
                   trace_marker=has_marker)
    return tp, fp


def check_clocks(tracefs: str | None) -> dict:
    clocks = hostfacts.trace_clocks(tracefs) if tracefs else None
    if clocks is None:
        if tracefs and not hostfacts.is_root():
            return check(WARN, "trace_clock not readable (need root)", available=[], current=None)
        return check(MISSING, "trace_clock not readable", available=[], current=None)
    available, current = clocks
    monotonic = [c for c in ("mono", "boot") if c in available]
    status = OK if monotonic else WARN
    detail = " ".join(available) + f" (current {current})"
    if not monotonic:
        detail += "; no mono/boot clock to match user space"
    return check(status, detail, available=available, current=current)


def check_sched_debug(mount: bool) -> dict:
    """The sched debug file (:func:`harmony.probes.sched_debug.doctor_check`); as root and with
    ``mount``, mounts debugfs first where it is not."""
    default = hostfacts.DEBUGFS_DEFAULT
    mounted_by_doctor = False
    points = hostfacts.mountpoints("debugfs")
    error = ""
    if not points and mount and hostfacts.is_root() and default.is_dir():
        done, error = _mount("debugfs", default)
        points = hostfacts.mountpoints("debugfs")
        mounted_by_doctor = done and bool(points)
    debugfs = str(default) if str(default) in points else (points[0] if points else None)
    return sched_debug.doctor_check(debugfs, mounted_by_doctor, error)


def check_trace_cmd() -> dict:
    exe = shutil.which("trace-cmd")
    base = dict(present=False, path=exe, version=None, ftrace_enabled_writable=None)
    if not exe:
        return check(MISSING, "trace-cmd not installed (optional)", **base)
    rc, out, err = _run([exe, "--version"])
    m = re.search(r"version\s+(\S+)", out + "\n" + err)
    base.update(present=True, version=m.group(1) if m else None)
    detail = m.group(1) if m else "version unknown"
    # trace-cmd record writes /proc/sys/kernel/ftrace_enabled; write back its current value to see.
    knob = hostfacts.PROC / "sys/kernel/ftrace_enabled"
    current = hostfacts.read_text(knob)
    if current is not None and hostfacts.is_root():
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
        return check(WARN, f"{detail}; `trace-cmd record` would fail: {knob} not writable", **base)
    return check(OK, detail + " (optional)", **base)


def check_decoder() -> dict:
    """Which trace decoder runs here: the compiled kernels (numba) or the numpy fallback."""
    ok, detail = jit.describe()
    return check(OK if ok else WARN, detail, numba=jit.numba_version(), mode=jit.mode())


def check_memory() -> dict:
    """Whether a decode's memory is faulted in ahead of it (harmony.core.memory.prefault_heap)."""
    ok, detail = memory.describe()
    return check(OK if ok else WARN, detail, prefault=ok)


# --------------------------------------------------------------------------------------------
# doctor


def _guarded(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # a check must not take the doctor down with it
        return check(WARN, f"check failed: {type(e).__name__}: {e}".splitlines()[0], error=str(e))


def _verdict(facts: dict, probes: list) -> dict:
    """Whether an experiment can run here, and with which of the recording ``probes``."""
    unavailable: dict[str, str] = {}
    for probe in probes:
        why = probe.cannot_record(facts)
        if why:
            unavailable[probe.name] = why
    usable = [p.name for p in probes if p.name not in unavailable]
    root = facts["root"].get("root", False)
    can_run = root and bool(usable)
    reasons = []
    if not can_run:
        if not root:
            reasons.append(f"not running as root (euid {facts['root'].get('euid')}): recording "
                           f"needs root; without it: {', '.join(WITHOUT_ROOT)}")
        reasons += list(unavailable.values())
    return {"can_run": can_run, "probes": usable, "reasons": reasons, "unavailable": unavailable}


#: what a user who is not root can still do (no command among these needs root)
WITHOUT_ROOT = ("harmony import (a trace from elsewhere)", "report", "infer", "compare",
                "simulate", "export", "list")


def doctor(mount: bool = True, test_record: bool = True, probes: tuple[str, ...] | None = None,
           vm: bool = False) -> dict:
    """Detect what this host can do; return JSON-serialisable facts (see the module docstring).

    ``mount``: as root, mount tracefs (and debugfs) if they are not mounted. ``test_record``: a
    probe may try a short test recording (perf: a 10 ms ``perf record``, ~0.3 s); without it,
    such a probe is only found, and not usable. Keys: one per name in :data:`CHECKS`, plus
    ``verdict`` = ``{"can_run", "probes", "reasons", "unavailable"}``, ``online_cpus``,
    ``scheduler`` name shortcut inside ``scheduler["name"]``, ``notes`` and ``elapsed_s``.
    ``can_run`` is true when running as root and at least one probe (a tracefs instance with
    sched_switch, sched_migrate_task and sched_wakeup, or perf recording sched tracepoints) can
    record. ``probes``: check only these probes (the guest agent checks tracefs, whose check
    loads no pandas); ``vm``: also the ``vm`` check (:func:`harmony.vm.machine.doctor_check`: can
    this host boot kernels under test, with which accelerator).
    """
    t0 = time.monotonic()
    release = os.uname().release
    config, config_source = hostfacts.kernel_config(release)
    facts: dict = {}
    facts["root"] = _guarded(check_root)
    facts["kernel"] = _guarded(check_kernel)
    facts["scheduler"] = _guarded(check_scheduler, release)
    facts["sched_ext"] = _guarded(check_sched_ext)
    facts["cpus"] = _guarded(check_cpus)
    facts["topology"] = _guarded(check_topology)
    facts["isolation"] = _guarded(check_isolation)
    facts["hz"] = _guarded(check_hz, config, config_source)
    facts["cgroup"] = _guarded(check_cgroup)
    facts["release"] = _guarded(release_check, facts["sched_ext"], facts["cpus"])
    facts["tracefs"] = _guarded(check_tracefs, mount)
    tracefs = facts["tracefs"].get("path")
    tp_fp = _guarded(check_tracepoints, tracefs)
    if isinstance(tp_fp, tuple):
        facts["sched_tracepoints"], facts["ftrace_print"] = tp_fp
    else:
        facts["sched_tracepoints"] = facts["ftrace_print"] = tp_fp
    facts["trace_clocks"] = _guarded(check_clocks, tracefs)
    facts["sched_debug"] = _guarded(check_sched_debug, mount)
    facts["sched_domains"] = _guarded(check_sched_domains)     # debugfs mounted by now
    facts["task_counters"] = _guarded(proc_sched.doctor_check)
    facts["preemption"] = _guarded(check_preemption, facts["sched_debug"].get("debugfs"),
                                   config, config_source)
    # each probe that records answers its own check, from the facts above (a probe that only
    # replays recordings answers none)
    checked = []
    for name in (PROBES if probes is None else probes):
        probe = get_probe(name)
        answer = _guarded(probe.doctor_check, facts, test_record)
        if answer is not None:
            facts[probe.check_name or probe.name] = answer
            checked.append(probe)
    facts["trace_cmd"] = _guarded(check_trace_cmd)
    facts["decoder"] = _guarded(check_decoder)
    facts["memory"] = _guarded(check_memory)
    if vm:
        cached = kernels.cached()
        facts["vm"] = _guarded(vm_check, cached[0] if cached else None)
    order = [*(name for name in CHECKS if name in facts),   # a probe not checked has no entry
             *(name for name in facts if name not in CHECKS)]
    facts = {name: facts[name] for name in order}  # stable order
    facts["online_cpus"] = facts["cpus"].get("online", [])
    facts["verdict"] = _verdict(facts, checked)
    notes = []
    if facts["tracefs"].get("mounted_by_doctor"):
        notes.append(f"mounted tracefs at {facts['tracefs']['path']}")
    if facts["sched_debug"].get("debugfs_mounted_by_doctor"):
        notes.append(f"mounted debugfs at {facts['sched_debug']['debugfs']}")
    for name in order:  # a check that removed what a dead doctor left says so
        if facts[name].get("reclaimed"):
            notes.append("removed stale instances: " + ", ".join(facts[name]["reclaimed"]))
    notes += facts["topology"].get("notes", [])
    facts["notes"] = notes
    facts["elapsed_s"] = round(time.monotonic() - t0, 3)
    return facts


def run_facts(facts: dict) -> dict:
    """What a run's manifest records of the system it runs on, from :func:`doctor`'s facts:
    kernel, scheduler, CPU count, HZ, preemption, topology, sched_ext state, and all the facts."""
    return {
        "kernel": facts["kernel"].get("release"),
        "scheduler": facts["scheduler"].get("name"),
        "ncpus": len(facts.get("online_cpus", [])),
        "hz": facts["hz"].get("hz"),
        "preemption": facts["preemption"].get("model"),
        "topology": facts["topology"].get("counts"),
        "sched_ext": facts["sched_ext"].get("state"),
        "doctor": facts,
    }


def format_doctor(facts: dict) -> str:
    """Render :func:`doctor` facts as an aligned table (check, status, detail) plus the verdict."""
    rows = [(name, c.get("status", "?"), c.get("detail", "")) for name, c in facts.items()
            if isinstance(c, dict) and "status" in c]
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
    for line in (facts.get("sched_domains") or {}).get("lines", []):
        lines.append(f"{indent}  {line}")
    for reason in v.get("reasons", []):
        lines.append(f"{indent}- {reason}")
    if v.get("can_run"):
        for probe, reason in v.get("unavailable", {}).items():
            lines.append(f"{indent}- {probe} unavailable: {reason.split(': ', 1)[-1]}")
    for note in facts.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)
