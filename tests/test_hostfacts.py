"""harmony.hostfacts (and the cpulists of harmony.core.osutil): cpulists, topology, scheduler name
(real host where it matters)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from harmony import hostfacts
from harmony.core.osutil import format_cpulist, online_cpus, parse_cpulist
from harmony.hostfacts import kernel_version, scheduler_name, topology

# ------------------------------------------------------------------------------------ cpulists


@pytest.mark.parametrize(
    "text, cpus",
    [
        ("0", [0]),
        ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
        ("0-1\n", [0, 1]),
        ("5-5", [5]),
        ("8,0-3", [0, 1, 2, 3, 8]),
        (" 0 - 2 , 4 ", [0, 1, 2, 4]),
        ("127", [127]),
    ],
)
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize(
    "text",
    ["3-1", "a", "", "   ", "-1", "-1-3", "1,,2", "1,", ",1", "0-", "1-2-3", "0x1", "1 2", "0-3,2",
     "2,2", "0-99999999", "1.5", "0-7:2/4"],
)
def test_parse_cpulist_rejects(text):
    with pytest.raises(ValueError) as e:
        parse_cpulist(text)
    msg = str(e.value)
    assert msg and "\n" not in msg


def test_parse_cpulist_rejects_non_string():
    with pytest.raises(ValueError):
        parse_cpulist(None)


@pytest.mark.parametrize(
    "cpus, text",
    [([], ""), ([0], "0"), ([0, 1], "0-1"), ([0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"),
     ([11, 3, 2, 3], "2-3,11"), ((c for c in [4, 6]), "4,6")],
)
def test_format_cpulist(cpus, text):
    assert format_cpulist(cpus) == text


@pytest.mark.parametrize("bad", [[-1], [0, "1"], [True], [1.0]])
def test_format_cpulist_rejects(bad):
    with pytest.raises(ValueError):
        format_cpulist(bad)


@pytest.mark.parametrize("text", ["0", "0-1", "0-3,8,10-11", "1,3,5-9,64-127"])
def test_cpulist_round_trip(text):
    assert format_cpulist(parse_cpulist(text)) == text


# ------------------------------------------------------------------------------ online CPUs


def test_online_cpus_matches_sysfs():
    cpus = online_cpus()
    text = Path("/sys/devices/system/cpu/online").read_text()
    assert cpus == parse_cpulist(text)
    assert 1 <= len(cpus) <= os.cpu_count()


def test_online_cpus_falls_back_to_affinity(tmp_path):
    assert online_cpus(tmp_path) == sorted(os.sched_getaffinity(0))


# --------------------------------------------------------------------------------- topology


def _lscpu() -> dict[str, dict[int, str]]:
    """``lscpu -p``'s columns (CPU, Core, Socket, Node, the last cache level's id), per online
    CPU: util-linux's reading of the topology, not Harmony's."""
    out = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET,NODE,CACHE"], capture_output=True,
                         text=True, check=True).stdout
    cols: dict[str, dict[int, str]] = {"core": {}, "socket": {}, "node": {}, "llc": {}}
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        cpu, core, socket, node, caches = line.split(",", 4)
        for k, v in (("core", core), ("socket", socket), ("node", node),
                     ("llc", caches.split(":")[-1].split(",")[-1])):
            cols[k][int(cpu)] = v
    return cols


def _groups(by: dict[int, str]) -> list[list[int]] | None:
    """CPUs grouped by a column's value (None where lscpu gave none)."""
    if not by or any(v == "" for v in by.values()):
        return None
    out: dict[str, list[int]] = {}
    for cpu, v in sorted(by.items()):
        out.setdefault(v, []).append(cpu)
    return sorted(out.values())


@pytest.mark.needs_tool("lscpu")
def test_topology_real_host():
    """The host's topology as sysfs gives it, against lscpu's reading of it: the online CPUs,
    the package, core, NUMA and last-level cache groups and their counts."""
    topo = topology()
    online = online_cpus()
    lscpu = _lscpu()
    assert [c["cpu"] for c in topo["cpus"]] == online == sorted(lscpu["core"])
    assert topo["counts"]["threads"] == len(online) == os.sysconf("SC_NPROCESSORS_ONLN")
    cores = {cpu: f"{lscpu['socket'][cpu]}/{core}" for cpu, core in lscpu["core"].items()}
    want = {"smt": _groups(cores), "package": _groups(lscpu["socket"]),
            "numa": _groups(lscpu["node"]), "llc": _groups(lscpu["llc"])}
    for name, groups in want.items():
        if groups is not None:
            assert sorted(topo["groups"][name]) == groups, (name, topo["groups"][name], groups)
    assert topo["counts"]["packages"] == len(want["package"])
    assert topo["counts"]["cores"] == len(want["smt"])
    if want["llc"] is not None:
        assert topo["counts"]["llcs"] == len(want["llc"])
    for c in topo["cpus"]:
        if c["siblings"] is not None:
            assert c["cpu"] in c["siblings"]
        if c["llc_cpus"] is not None:
            assert c["cpu"] in c["llc_cpus"]
            assert c["llc_level"] >= 1
    # every grouping is a partition of the online CPUs (where the field is known)
    for name, groups in topo["groups"].items():
        flat = sorted(c for g in groups for c in g)
        assert len(flat) == len(set(flat)), name
        assert set(flat) <= set(online), name
    counts = topo["counts"]
    for key in ("packages", "cores", "llcs", "numa_nodes"):
        assert counts[key] is None or 1 <= counts[key] <= len(online)
    json.dumps(topo)


def _write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _fake_sysfs(root: Path, *, numa=True, drop_core_id=(), drop_cache=()):
    """4 CPUs: 2 packages x 1 core x 2 SMT threads, an L3 per package, a NUMA node per package."""
    cpu_dir = root / "devices/system/cpu"
    _write(cpu_dir / "online", "0-3")
    _write(cpu_dir / "smt/active", "1")
    for cpu in range(4):
        pkg = cpu // 2
        siblings = f"{2 * pkg}-{2 * pkg + 1}"
        t = cpu_dir / f"cpu{cpu}/topology"
        _write(t / "physical_package_id", str(pkg))
        if cpu not in drop_core_id:
            _write(t / "core_id", "0")
        _write(t / "thread_siblings_list", siblings)
        if cpu in drop_cache:
            continue
        cache = cpu_dir / f"cpu{cpu}/cache"
        for idx, (level, ctype, shared) in enumerate(
            [(1, "Data", siblings), (1, "Instruction", siblings), (2, "Unified", siblings),
             (3, "Unified", siblings)]
        ):
            _write(cache / f"index{idx}/level", str(level))
            _write(cache / f"index{idx}/type", ctype)
            _write(cache / f"index{idx}/shared_cpu_list", shared)
    if numa:
        _write(root / "devices/system/node/node0/cpulist", "0-1")
        _write(root / "devices/system/node/node1/cpulist", "2-3")


def test_topology_fake_sysfs(tmp_path):
    _fake_sysfs(tmp_path)
    topo = topology(tmp_path)
    assert topo["counts"] == {"packages": 2, "cores": 2, "threads": 4, "llcs": 2, "numa_nodes": 2}
    assert topo["groups"]["smt"] == [[0, 1], [2, 3]]
    assert topo["groups"]["llc"] == [[0, 1], [2, 3]]
    assert topo["groups"]["numa"] == [[0, 1], [2, 3]]
    assert topo["smt_active"] is True
    c3 = topo["cpus"][3]
    assert (c3["package"], c3["core"], c3["siblings"], c3["llc_index"], c3["llc_level"],
            c3["llc_cpus"], c3["node"]) == (1, 0, [2, 3], "index3", 3, [2, 3], 1)
    assert topo["notes"] == []


def test_topology_missing_files_are_none_with_notes(tmp_path):
    _fake_sysfs(tmp_path, numa=False, drop_core_id=(3,), drop_cache=(2, 3))
    topo = topology(tmp_path)
    c2, c3 = topo["cpus"][2], topo["cpus"][3]
    assert c3["core"] is None and c2["core"] == 0
    assert c2["llc_cpus"] is None and c3["llc_index"] is None
    assert all(c["node"] is None for c in topo["cpus"])
    assert topo["counts"]["numa_nodes"] is None
    assert topo["counts"]["llcs"] == 1
    notes = " | ".join(topo["notes"])
    assert "core_id for CPUs 3" in notes
    assert "cache/ for CPUs 2-3" in notes
    assert "node" in notes
    json.dumps(topo)


# -------------------------------------------------------------------------------- scheduler


def test_kernel_version():
    assert kernel_version("6.18.44-fc-v595") == (6, 18)
    assert kernel_version("5.15.0-91-generic") == (5, 15)
    assert kernel_version("weird") is None


def test_scheduler_name_by_version_and_sched_ext(tmp_path):
    none = tmp_path / "absent"
    assert scheduler_name("6.5.13", none) == "CFS"
    assert scheduler_name("6.6.0", none) == "EEVDF"
    assert scheduler_name("6.12.1", none) == "EEVDF"
    scx = tmp_path / "sched_ext"
    _write(scx / "state", "disabled")
    assert scheduler_name("6.12.1", scx) == "EEVDF"
    _write(scx / "state", "enabled")
    _write(scx / "root/ops", "rusty")
    assert scheduler_name("6.12.1", scx) == "rusty"
    # the release alone implies the fair class's scheduler, whatever this host runs
    assert hostfacts.implied_scheduler("6.12.1") == "EEVDF"
    assert hostfacts.implied_scheduler("6.1.0-50-amd64") == "CFS"
    assert hostfacts.implied_scheduler("not a release") is None
    assert scheduler_name("not a release", none) == "unknown"
    assert hostfacts.sched_ext_state(scx)["state"] == "enabled"
    assert hostfacts.sched_ext_state(none) == {"state": "not built", "ops": None,
                                               "switch_all": None}


def test_scheduler_name_real_host():
    assert scheduler_name() in {"EEVDF", "CFS"} or hostfacts.sched_ext_state()["state"] == "enabled"
