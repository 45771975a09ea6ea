"""The machine's shape as data: /proc/schedstat's domain lines, debugfs's domain files (with
sched/verbose turned on for the read and back), the manifest's topology read from real guests'
files (tests/data/topology), each migration's level, the moves by level and the per-level check
against the kernel's counters; and, on this host, the domains read against independent reads."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pandas as pd
import pytest

from harmony import hostfacts
from harmony.analysis import tables
from harmony.analysis import topology as T
from harmony.analysis.counters import by_level
from harmony.core import osutil
from harmony.probes import domains, schedstat

from topology_fixtures import guest_topology, lay_out, load, names as fixture_names


# ------------------------------------------------------------------------ /proc/schedstat

def test_cpu_masks_are_read_as_the_kernel_prints_them():
    assert schedstat.parse_mask("3") == [0, 1]
    assert schedstat.parse_mask("0c") == [2, 3]
    assert schedstat.parse_mask("00000001,00000000") == [32]
    assert schedstat.parse_mask("ff") == list(range(8))
    with pytest.raises(schedstat.SchedstatError, match="'zz' is not a CPU mask"):
        schedstat.parse_mask("zz")


@pytest.mark.parametrize("name,version,spans", [
    ("612-s2c2", 16, [[0, 1], [0, 1, 2, 3]]),                   # Debian 6.12: MC, PKG
    ("61-s2c2t2-numa", 15, [[0, 1, 2, 3], list(range(8))]),     # Debian 6.1: MC, NUMA
    ("612-s2c2t2-numa", 16, [[0, 1], [0, 1, 2, 3], list(range(8))]),
])
def test_each_domain_line_of_real_files_is_kept(name, version, spans):
    got = schedstat.parse(load(name)["schedstat"])
    assert got["version"] == version
    assert [d["span"] for d in got["domains"][0]] == spans
    assert [d["index"] for d in got["domains"][0]] == list(range(len(spans)))
    assert all(d["name"] is None for d in got["domains"][0])       # no name before v17
    for cpu, doms in got["domains"].items():    # the sums are the domains' sums
        for c in schedstat.COUNTERS:
            assert got["cpus"][cpu][c] == sum(d[c] for d in doms)


def test_a_version_17_domain_has_its_name_and_every_counter_in_place():
    per = [[100 * t + k for k in range(11)] for t in range(3)]      # busy, idle, newidle
    tail = list(range(900, 912))
    line = "domain1 PKG 0f " + " ".join(str(v) for v in sum(per, []) + tail)
    got = schedstat.parse(f"version 17\ntimestamp 1\ncpu2 0 0 0 0 0 0 0 0 0\n{line}\n")
    d = got["domains"][2][0]
    assert (d["index"], d["name"], d["span"]) == (1, "PKG", [0, 1, 2, 3])
    assert (d["lb_count_busy"], d["lb_failed_idle"], d["lb_gained_newidle"]) == (0, 102, 207)
    assert (d["alb_count"], d["alb_failed"], d["alb_pushed"], d["ttwu_move_affine"]) == (
        900, 901, 902, 910)


# ------------------------------------------------------------------ the manifest's topology

def test_a_guests_topology_is_read_from_its_files(tmp_path):
    fx = load("612-s2c2t2-numa")
    topo = guest_topology(fx, tmp_path)
    assert topo["source"]["debugfs"] and topo["source"]["schedstat_version"] == 16
    assert not topo["source"]["verbose_toggled"]        # the laid-out tree has its domains
    cpu5 = topo["domains"]["5"]
    assert [d["name"] for d in cpu5] == ["SMT", "MC", "NUMA"]
    assert [d["span"] for d in cpu5] == [[4, 5], [4, 5, 6, 7], list(range(8))]
    for d in cpu5:              # every parameter as the kernel's file says
        for k in domains.INT_FILES:
            assert d[k] == int(fx["debugfs"][f"cpu5/domain{d['index']}/{k}"])
        assert d["flags"] == fx["debugfs"][f"cpu5/domain{d['index']}/flags"].split()
    assert cpu5[0]["imbalance_pct"] == 110 and cpu5[1]["imbalance_pct"] == 117
    die = int(fx["sysfs"]["devices/system/cpu/cpu5/topology/die_id"])
    assert topo["cpus"]["5"] == {"package": 1, "die": die, "core": 0, "thread_siblings": [4, 5],
                                 "llc": 4, "node": 1}
    json.dumps(topo)        # what the manifest holds


def test_a_guest_reads_its_shape_again_only_when_it_changed(tmp_path, monkeypatch):
    """keep_within_the_boot (the VM agent): the sysfs topology and debugfs are read again only
    when the CPUs on line or a domain's span in /proc/schedstat changed; a kept read says so, and
    is a copy (a run that changes its manifest's topology changes no other run's)."""
    fx = load("612-s2c2t2-numa")
    paths = lay_out(fx, tmp_path)
    reads, online = [], list(range(8))
    monkeypatch.setattr(domains, "debugfs_root", lambda: paths["debugfs"])
    monkeypatch.setattr(schedstat, "SCHEDSTAT", paths["schedstat"])
    monkeypatch.setattr(domains, "online_cpus", lambda: list(online))
    monkeypatch.setattr(hostfacts, "topology",
                        lambda real=hostfacts.topology: reads.append(1) or real(paths["sysfs"]))
    monkeypatch.setattr(domains, "_kept", None)
    monkeypatch.setattr(domains, "_keep", False)
    first = domains.read()
    domains.read()
    assert len(reads) == 2                      # not asked: every read reads
    domains.keep_within_the_boot()
    first = domains.read()
    second = domains.read()
    assert len(reads) == 3 and "kept_from" not in first["source"]
    assert second["source"]["kept_from"] > 0
    assert {k: v for k, v in second.items() if k != "source"} == \
        {k: v for k, v in first.items() if k != "source"}
    second["domains"]["5"][0]["span"].append(99)
    assert domains.read()["domains"]["5"][0]["span"] == [4, 5]
    online.remove(7)                            # a CPU off line: read again
    domains.read()
    assert len(reads) == 4
    text = paths["schedstat"].read_text()       # a domain rebuilt with another span
    paths["schedstat"].write_text(text.replace(" ff ", " 7f ", 1))
    assert paths["schedstat"].read_text() != text
    domains.read()
    assert len(reads) == 5


def test_without_debugfs_the_spans_come_from_schedstat_and_names_are_none(tmp_path):
    paths = lay_out(load("61-s2c2"), tmp_path)
    topo = domains.read(debugfs=tmp_path / "nowhere", topo=hostfacts.topology(paths["sysfs"]),
                        schedstat_path=paths["schedstat"])
    assert [d["span"] for d in topo["domains"]["2"]] == [[2, 3], [0, 1, 2, 3]]
    assert [d["name"] for d in topo["domains"]["2"]] == [None, None]
    assert T.df_domains({"topology": topo})["name"].tolist()[:2] == ["domain0", "domain1"]
    assert any("no " in m and "sched" in m for m in topo["source"]["missing"])


def test_verbose_is_turned_on_for_the_read_and_back(tmp_path, monkeypatch):
    monkeypatch.setattr(osutil, "LOCK_DIRS", (tmp_path / "locks",))
    sched = tmp_path / "debug" / "sched"
    sched.mkdir(parents=True)
    (sched / "verbose").write_text("N\n")
    written = []
    real_write = type(sched).write_text

    def spy(self, text, *a, **k):
        if self.name == "verbose":
            written.append(text)
            # recorded before it is turned on: the next start puts it back from the record
            assert list((tmp_path / "locks").glob(f"{domains.RECORD}-*.json"))
        return real_write(self, text, *a, **k)

    monkeypatch.setattr(type(sched), "write_text", spy)
    found, toggled, problems = domains.read_debugfs(tmp_path / "debug")
    assert written == ["Y", "N"] and toggled and found is None
    assert "no sched/domains even with sched/verbose Y" in problems[0]
    assert (sched / "verbose").read_text() == "N"
    assert not list((tmp_path / "locks").glob("*.json"))
    # a kernel that refuses the file (lockdown): said, nothing written
    (sched / "verbose").unlink()
    (sched / "verbose").mkdir()
    written.clear()
    found, toggled, problems = domains.read_debugfs(tmp_path / "debug")
    assert found is None and not toggled and not written
    assert "sched/verbose cannot be read" in problems[0]


def test_a_dead_runs_verbose_is_put_back(tmp_path, monkeypatch):
    monkeypatch.setattr(osutil, "LOCK_DIRS", (tmp_path / "locks",))
    (tmp_path / "locks").mkdir()
    verbose = tmp_path / "verbose"
    verbose.write_text("Y")
    proc = subprocess.Popen(["true"])
    proc.wait()
    (tmp_path / "locks" / f"{domains.RECORD}-{proc.pid}.json").write_text(json.dumps(
        {"controller_pid": proc.pid, "controller_start": 1, "pids": [], "path": str(verbose),
         "was": "N"}))
    assert domains.reclaim_stale() == [f"debugfs sched/verbose back to N (turned on by dead run "
                                       f"{proc.pid})"]
    assert verbose.read_text() == "N" and not list((tmp_path / "locks").glob("*.json"))


def test_sources_that_disagree_keep_the_spans():
    missing: list[str] = []
    stats = {"domains": {0: [{"span": [0, 1], "name": None}, {"span": [0, 1, 2, 3],
                                                              "name": None}]}}
    dbg = {0: [{"name": "MC", "flags": [], **dict.fromkeys(domains.INT_FILES, 1)}]}
    got = domains.merge(dbg, stats, missing)
    assert [d["span"] for d in got["0"]] == [[0, 1], [0, 1, 2, 3]]
    assert got["0"][0]["name"] is None and "debugfs shows 1, /proc/schedstat 2" in missing[0]


# ---------------------------------------------------------------------- levels and tables

@pytest.fixture
def numa8(tmp_path):
    """The manifest of a run on Debian 6.12's 2 nodes x 2 cores x 2 threads guest."""
    return {"cpus": list(range(8)), "t0_ns": 0, "end_ns": 10**9,
            "topology": guest_topology(load("612-s2c2t2-numa"), tmp_path)}


def test_a_migrations_level_is_the_lowest_domain_of_the_destination_spanning_the_source(numa8):
    assert T.migration_level(0, 1, numa8) == (0, "SMT")
    assert T.migration_level(1, 3, numa8) == (1, "MC")
    assert T.migration_level(6, 2, numa8) == (2, "NUMA")
    assert T.migration_level(4, 4, numa8) == (None, None)
    assert T.migration_level(0, 9, numa8) == (None, None)
    src, dst = np.array([1, 3, 2, 4, 9]), np.array([0, 1, 6, 4, 0])
    cols = T.level_columns(src, dst, numa8)
    assert cols["level"].tolist() == [0, 1, 2, -1, -1]
    assert list(pd.Series(cols["level_name"]).astype(object).fillna("-")) == [
        "SMT", "MC", "NUMA", "-", "-"]
    assert list(cols["level_name"].categories) == ["SMT", "MC", "NUMA"]
    # no domains: no level
    assert T.level_columns(src, dst, None)["level"].tolist() == [-1] * 5


def test_levels_of_an_asymmetric_machine_are_counted_by_name():
    # CPU 0 has an SMT sibling, CPU 2 none: index 0 is SMT on one and MC on the other
    doms = {0: [{"index": 0, "name": "SMT", "span": [0, 1]},
                {"index": 1, "name": "MC", "span": [0, 1, 2]}],
            2: [{"index": 0, "name": "MC", "span": [0, 1, 2]}]}
    table = T.LevelTable(doms)
    index, code = table.of(np.array([0, 0, 2]), np.array([1, 2, 0]))
    assert index.tolist() == [0, 1, 0]
    assert [table.keys[c] for c in code] == ["SMT", "MC", "MC"] and table.keys == ["SMT", "MC"]


def test_the_tables_and_relations(numa8):
    d = T.df_domains(numa8)
    tables.DOMAINS.check(d)
    assert len(d) == 24 and d.loc[d["cpu"] == 3, "span"].tolist() == ["2-3", "0-3", "0-7"]
    assert d.loc[d["name"] == "NUMA", "min_interval"].unique().tolist() == [8.0]
    c = T.df_cpus(numa8)
    tables.CPUS.check(c)
    assert c["node"].tolist() == [0] * 4 + [1] * 4
    assert [T.relation(0, b, c) for b in (0, 1, 2, 5)] == ["same", "smt", "llc", "remote"]
    assert T.df_domains({}).empty


def test_moves_are_counted_by_level_and_cause(numa8):
    src, dst = np.array([1, 3, 2, 5, 0]), np.array([0, 0, 6, 5, 1])
    mig = pd.DataFrame({"ts": [1, 2, 3, 4, 2 * 10**9], "src_cpu": src, "dst_cpu": dst,
                        "cause": pd.Categorical(["periodic", "wakeup", "active", "wakeup",
                                                 "newidle"]),
                        **T.level_columns(src, dst, numa8)})
    # the last move is after the window, the fourth to the CPU it was on
    assert T.counts_by_level(mig, 0, 10**9) == {"SMT": {"periodic": 1}, "MC": {"wakeup": 1},
                                                "NUMA": {"active": 1}}


def _reads(per_cpu: dict) -> dict:
    """A schedstat read (as the manifest keeps it) whose CPUs' domains have the given
    counters: {cpu: [{counter: value}, ...]}, spans of the 8-CPU guest."""
    spans = {c: [[c - c % 2, c - c % 2 + 1], [c - c % 4 + k for k in range(4)],
                 list(range(8))] for c in range(8)}
    zero = dict.fromkeys(schedstat.DOMAIN_COUNTERS, 0)
    return {"domains": {str(c): [{"index": i, "name": None, "span": spans[c][i], **zero,
                                  **per_cpu.get(c, [{}] * 3)[i]} for i in range(3)]
                        for c in range(8)}}


def test_the_kernels_counts_agree_level_by_level(numa8):
    start = _reads({})
    end = _reads({0: [{"lb_gained_idle": 2}, {"lb_gained_newidle": 1},
                      {"lb_gained_idle": 1, "alb_pushed": 1}]})
    moves = pd.DataFrame({"ts": [50, 60, 70, 80, 5], "src_cpu": [1, 1, 2, 5, 1],
                          "dst_cpu": [0, 0, 0, 0, 0], "rt": [False] * 5,
                          "cause": pd.Categorical(["periodic", "periodic", "newidle", "active",
                                                   "periodic"])})
    mine = moves.assign(inferred=False).iloc[:0]
    w = [0, 10, 100, 110]           # the reads' windows: the move at 5 is in the first
    got = by_level(start, end, [0, 1], moves, mine, w, numa8["topology"])
    assert list(got) == ["SMT", "MC", "NUMA"]
    assert got["SMT"]["kernel"]["periodic"] == 2 and got["SMT"]["all"]["periodic"] == 2
    assert got["SMT"]["unsure"]["periodic"] == 1 and got["SMT"]["within"]
    # the stopper's move counts in lb_gained[idle] too: not a periodic one
    assert got["NUMA"]["kernel"] == {"periodic": 0, "newidle": 0, "active": 1,
                                     "wake_affine": 0} and got["NUMA"]["within"]
    assert got["MC"]["within"] and got["MC"]["all"]["newidle"] == 1
    # a move the kernel did not count at that level: disagreement named
    moves.loc[2, "src_cpu"] = 5        # the new-idle move now crosses nodes
    got = by_level(start, end, [0, 1], moves, mine, w, numa8["topology"])
    assert not got["MC"]["within"] and "newidle" not in got["NUMA"]["agreeing"]
    # domains rebuilt between the reads: no comparison
    end["domains"]["0"] = end["domains"]["0"][:2]
    assert by_level(start, end, [0, 1], moves, mine, w, numa8["topology"]) is None


# ------------------------------------------------------------------------------ this host

def test_this_hosts_topology_against_independent_reads(kernel):
    """The host's CPUs as lscpu sees them; its domains as /proc/schedstat and debugfs show them,
    read independently here, or the reasons they cannot be read (this project's host: debugfs
    in lockdown, no CONFIG_SCHEDSTATS)."""
    topo = domains.read()
    out = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET,NODE"], capture_output=True, text=True)
    rows = [line.split(",") for line in out.stdout.splitlines() if line[:1].isdigit()]
    assert sorted(int(r[0]) for r in rows) == sorted(map(int, topo["cpus"]))
    for cpu, core, socket, node in rows:
        got = topo["cpus"][cpu]
        assert got["package"] == int(socket)
        if node:
            assert got["node"] == int(node)
        same_core = [int(r[0]) for r in rows if (r[1], r[2]) == (core, socket)]
        assert sorted(got["thread_siblings"]) == sorted(same_core)
    try:
        text = open("/proc/schedstat").read()
    except OSError as exc:
        text = None
        assert any(str(schedstat.SCHEDSTAT) in m and exc.strerror in m
                   for m in topo["source"]["missing"])
    if text is not None:
        spans = {}
        for line in text.splitlines():
            f = line.split()
            if f and f[0].startswith("cpu") and f[0][3:].isdigit():
                cpu = f[0][3:]
            elif f and f[0].startswith("domain"):
                bits = int((f[2] if topo["source"]["schedstat_version"] >= 17 else f[1])
                           .replace(",", ""), 16)
                spans.setdefault(cpu, []).append([c for c in range(bits.bit_length())
                                                  if bits >> c & 1])
        assert {c: [d["span"] for d in ds] for c, ds in topo["domains"].items()} == spans
    verbose = "/sys/kernel/debug/sched/verbose"
    try:
        before = open(verbose).read()
    except OSError as exc:
        assert not topo["source"]["debugfs"]
        assert any("sched/verbose" in m and exc.strerror in m for m in topo["source"]["missing"])
    else:
        domains.read()
        assert open(verbose).read() == before           # put back as it was


# ------------------------------------------------------------------ doctor, report, figure

def test_doctor_shows_each_domain_or_why_not(numa8, monkeypatch):
    from harmony import doctor

    monkeypatch.setattr(domains, "read", lambda: numa8["topology"])
    c = doctor.check_sched_domains()
    assert c["status"] == "ok" and c["detail"].startswith("SMT(2) < MC(4) < NUMA(8) (CPU 0")
    assert c["lines"][0].startswith("domain0 SMT span 0-1 (CPUs 0-1): interval 2-4 ms, "
                                    "busy_factor 16, imbalance_pct 110, cache_nice_tries 0")
    assert len(c["lines"]) == 4 + 2 + 1       # 4 SMT pairs, 2 MCs, one NUMA: each said once
    shown = doctor.format_doctor({"sched_domains": c})
    assert "domain2 NUMA span 0-7 (CPUs 0-7)" in shown
    empty = {**numa8["topology"], "domains": {},
             "source": {**numa8["topology"]["source"], "missing": ["debugfs domains (x)"]}}
    monkeypatch.setattr(domains, "read", lambda: empty)
    c = doctor.check_sched_domains()
    assert c["status"] == "warn" and c["detail"] == "not readable: debugfs domains (x)"


def test_the_report_and_the_figure_show_the_machine(numa8, tmp_path):
    from harmony.analysis.plots_topology import plot_machine
    from harmony.analysis.report import machine_lines

    src, dst = np.array([1, 3, 2]), np.array([0, 0, 6])
    mig = pd.DataFrame({"ts": [1, 2, 3], "src_cpu": src, "dst_cpu": dst,
                        "cause": pd.Categorical(["periodic", "wakeup", "active"]),
                        **T.level_columns(src, dst, numa8)})
    summary = {"migrations_by_level": T.counts_by_level(mig, 0, 10)}
    lines = machine_lines(numa8, summary)
    assert lines[0].endswith("8 CPUs: 2 NUMA nodes, 2 packages, 2 LLCs, 4 cores of 2 threads")
    assert "SMT (0-1) < MC (0-3) < NUMA (0-7) (CPU 0)" in lines[1]
    assert lines[2].endswith("SMT 1 (periodic 1); MC 1 (wakeup 1); NUMA 1 (active 1)")
    assert machine_lines({"cpus": [0]}, None) == []     # a run that recorded no topology
    png = plot_machine(numa8, mig, tmp_path / "machine.png")
    assert png.stat().st_size > 5000


# ------------------------------------------- a real guest's asymmetric NUMA ring, through a hotplug

def _ring():
    """The readings of bench/topology_known.py's guest (tests/data/topology_known): Debian
    6.12.118, 4 nodes x 2 cores on a ring (neighbours 20, opposite 30), CPU 3 taken offline and
    back."""
    from pathlib import Path

    path = Path(__file__).parent / "data" / "topology_known" / "ring4-hotplug-612.json"
    return json.loads(path.read_text())


def _boot_account(lines):
    """{cpu: [span, ...]} from the kernel's own sched_verbose lines at boot (its account of the
    domains it attached: the reading independent of debugfs and /proc/schedstat)."""
    import re

    out, cpu = {}, None
    for line in lines:
        m = re.search(r"CPU(\d+) attaching sched-domain", line)
        if m:
            cpu = int(m.group(1))
            out[cpu] = []
        m = re.search(r"domain-\d+: span=(\S+) level=", line)
        if m and cpu is not None:
            out[cpu].append(osutil.parse_cpulist(m.group(1)))
    return out


def test_a_ring_s_domains_as_read_agree_with_the_kernel_s_boot_account():
    """Harmony's reading of the ring guest's domains (debugfs + /proc/schedstat) is the kernel's
    own account at boot, CPU by CPU and level by level: MC, then two NUMA levels (the node and
    its neighbours at 20, every node at 30)."""
    ring = _ring()
    account = _boot_account(ring["dmesg"])
    read = {int(c): [d["span"] for d in ds] for c, ds in ring["before"]["domains"].items()}
    assert len(account) == 8 and read == account
    assert [d["name"] for d in ring["before"]["domains"]["0"]] == ["MC", "NUMA", "NUMA"]


def test_levels_on_the_ring_and_around_a_cpu_taken_offline():
    """Each move's level on the ring: a neighbour node's CPU at the first NUMA level, the
    opposite node's at the second; while CPU 3 is offline CPU 2's MC level (a span of one CPU) is
    gone and the neighbour's CPUs are at its level 0; when it is back, every level as before."""
    ring = _ring()
    before, offline, online = (ring[k] for k in ("before", "offline", "online"))
    assert T.migration_level(1, 0, before) == (0, "MC")
    assert T.migration_level(2, 0, before) == (1, "NUMA")     # node 1: a neighbour of node 0
    assert T.migration_level(4, 0, before) == (2, "NUMA2")    # node 2: across the ring
    assert T.migration_level(3, 2, offline) == (None, None)   # CPU 3 has no domains
    assert T.migration_level(2, 0, offline) == (0, "NUMA")    # its own chain counts from 1
    assert T.migration_level(2, 6, offline) == (1, "NUMA2")
    table = T.LevelTable(offline)
    index, _ = table.of(np.array([2, 2, 0]), np.array([0, 6, 1]))    # node 3: opposite
    assert list(index) == [0, 1, 0]
    assert T.LevelTable(online).index.tolist() == T.LevelTable(before).index.tolist()


def _schedstat_v16(spans: dict[int, list[list[int]]], counts: dict) -> str:
    """A /proc/schedstat text of version 16 (6.12's layout: per idle type busy, idle, newidle 8
    counters, lb_gained the fifth; then alb_count alb_failed alb_pushed ...) with the given
    domains' spans and ``counts``: {(cpu, domain index): {"busy"|"idle"|"newidle"|"alb_pushed":
    n}}, every other counter 0."""
    lines = ["version 16", "timestamp 4294898253"]
    for cpu, chain in sorted(spans.items()):
        lines.append(f"cpu{cpu} " + " ".join(["0"] * 9))
        for i, span in enumerate(chain):
            got = counts.get((cpu, i), {})
            per_type = []
            for t in ("busy", "idle", "newidle"):
                per_type += [0, 0, 0, 0, got.get(t, 0), 0, 0, 0]
            tail = [0, 0, got.get("alb_pushed", 0)] + [0] * 9
            mask = f"{sum(1 << c for c in span):02x}"
            lines.append(f"domain{i} {mask} " + " ".join(map(str, per_type + tail)))
    return "\n".join(lines) + "\n"


def test_the_rings_two_numa_levels_are_counted_apart_and_agree_with_schedstat():
    """The ring guest's (tests/data/topology_known) two domain levels the kernel names NUMA (its
    neighbours' nodes at 20, every node at 30) are two keys, NUMA and NUMA2: each move is
    counted at its own one, in the migrations' level_name, the moves by level and cause, and
    the per-level check against the kernel's per-domain lines of /proc/schedstat (a text with
    the ring's spans, parsed as Harmony parses the kernel's, the independent reading)."""
    before = _ring()["before"]
    topo = before
    spans = {int(c): [d["span"] for d in ds] for c, ds in before["domains"].items()}
    assert T.df_domains({"topology": topo}).query("cpu == 0")["name"].tolist() == [
        "MC", "NUMA", "NUMA2"]
    assert domains.summary_line(topo).startswith("MC(2) < NUMA(6) < NUMA2(8) (CPU 0")
    assert any(line.startswith("domain2 NUMA2 span 0-7 (CPUs 0-7): ")
               for line in domains.describe(topo))
    # onto CPU 0: new-idle from its core's sibling (MC), periodic from a neighbour node's CPU
    # (NUMA), active from the opposite node's (NUMA2); a wake-up from a neighbour (NUMA)
    src, dst = np.array([1, 2, 4, 6]), np.array([0, 0, 0, 0])
    cause = ["newidle", "periodic", "active", "wakeup"]
    cols = T.level_columns(src, dst, topo)
    assert cols["level"].tolist() == [0, 1, 2, 1]
    assert list(cols["level_name"].astype(object)) == ["MC", "NUMA", "NUMA2", "NUMA"]
    assert list(cols["level_name"].categories) == ["MC", "NUMA", "NUMA2"]
    mig = pd.DataFrame({"ts": [50, 60, 70, 80], "src_cpu": src, "dst_cpu": dst,
                        "cause": pd.Categorical(cause), **cols})
    assert T.counts_by_level(mig, 0, 100) == {"MC": {"newidle": 1},
                                              "NUMA": {"periodic": 1, "wakeup": 1},
                                              "NUMA2": {"active": 1}}
    # the kernel's count of those moves, domain by domain of CPU 0 (the stopper's push counts
    # in lb_gained[idle] too)
    start = {"domains": schedstat.parse(_schedstat_v16(spans, {}))["domains"]}
    end = {"domains": schedstat.parse(_schedstat_v16(spans, {
        (0, 0): {"newidle": 1}, (0, 1): {"busy": 1}, (0, 2): {"idle": 1, "alb_pushed": 1}}))[
        "domains"]}
    for read in (start, end):       # as the manifest keeps a read: string CPU keys
        read["domains"] = {str(c): v for c, v in read["domains"].items()}
    moves = mig[["ts", "src_cpu", "dst_cpu", "cause"]].assign(rt=False)
    mine = moves.assign(inferred=False).iloc[:0]
    w = [0, 10, 100, 110]
    got = by_level(start, end, [0, 1], moves, mine, w, topo)
    assert list(got) == ["MC", "NUMA", "NUMA2"]
    assert got["NUMA"]["kernel"]["periodic"] == got["NUMA"]["all"]["periodic"] == 1
    assert got["NUMA"]["kernel"]["active"] == got["NUMA"]["all"]["active"] == 0
    assert got["NUMA2"]["kernel"]["active"] == got["NUMA2"]["all"]["active"] == 1
    assert got["NUMA2"]["kernel"]["periodic"] == got["NUMA2"]["all"]["periodic"] == 0
    assert got["MC"]["kernel"]["newidle"] == 1
    assert all(v["within"] for v in got.values()), got
    # the periodic move from the opposite node instead: the kernel counted it at the first
    # NUMA level, so both NUMA levels now disagree on it
    moves.loc[1, "src_cpu"] = 5
    got = by_level(start, end, [0, 1], moves, mine, w, topo)
    assert "periodic" not in got["NUMA"]["agreeing"]
    assert "periodic" not in got["NUMA2"]["agreeing"] and got["MC"]["within"]


@pytest.mark.parametrize("name", fixture_names())
def test_a_machine_with_one_domain_of_each_name_keeps_the_kernels_names(name, tmp_path):
    """Every recorded guest topology (one NUMA level at most): the level keys are the kernel's
    own names, in the tables, the moves' levels and the chains shown."""
    topo = guest_topology(load(name), tmp_path)
    for cpu, chain in topo["domains"].items():
        names = [d["name"] for d in chain]
        assert len(set(names)) == len(names) and None not in names, (cpu, names)
        assert domains.chain_keys(chain) == names
        assert [k for k in T.df_domains({"topology": topo}).query(f"cpu == {cpu}")["name"]] \
            == names
    first = topo["domains"][min(topo["domains"], key=int)]
    assert domains.summary_line(topo).startswith(" < ".join(
        f"{d['name']}({len(d['span'])})" for d in first) + " (CPU ")
