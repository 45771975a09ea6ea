"""--vm-topology: the spec and its presets, what they become for virtme-ng and QEMU, the domains a
guest should build, and the check that refuses a topology the guest did not get (against the
domains real Debian guests built: tests/data/topology/)."""

from __future__ import annotations

import pytest

from harmony.vm import topology as vt
from harmony.core.errors import ParameterError

from topology_fixtures import guest_topology, load


def test_every_preset_parses_and_says_what_it_models():
    for name, (spec, about) in vt.PRESETS.items():
        topo = vt.parse(name)
        assert topo.preset == name and about and vt.parse(spec).spec() == topo.spec()
        assert topo.vcpus <= vt.MAX_VCPUS
    # the four at least: SMT, 2 LLCs, 2 nodes, 2 nodes x 2 LLCs x 2 cores x 2 threads
    assert {"smt", "2llc", "2node", "2node-2llc-smt"} <= set(vt.PRESETS)
    assert vt.parse("2node-2llc-smt").vcpus == 16


def test_the_options_virtme_ng_and_qemu_get():
    topo = vt.parse("sockets=2,cores=2,threads=2,numa=per-socket")
    assert topo.vcpus == 8 and topo.smp() == "8,sockets=2,cores=2,threads=2"
    assert topo.vng_args(1024) == ["--cpus", "8,sockets=2,cores=2,threads=2",
                                   "--numa", "512M,cpus=0-3", "--numa", "512M,cpus=4-7"]
    # under TCG a CPU whose CPUID tells threads and dies; under KVM virtme-ng's host model
    assert topo.qemu_opts("tcg") == ["-cpu", "max,vendor=GenuineIntel"]
    assert topo.qemu_opts("kvm") == []
    assert vt.parse("sockets=2,cores=2,cpu=Skylake-Server").qemu_opts("kvm") == [
        "-cpu", "Skylake-Server"]
    d = vt.parse("sockets=2,cores=1,numa=2,distance=31")
    assert d.vng_args(1000) == ["--cpus", "2,sockets=2,cores=1,threads=1",
                                "--numa", "500M,cpus=0-0", "--numa", "500M,cpus=1-1",
                                "--numa-distance", "0,1=31", "--numa-distance", "1,0=31"]
    assert vt.parse("2llc").smp() == "4,sockets=1,dies=2,cores=2,threads=1"
    assert vt.parse("sockets=2,cores=2,numa=2").vm_memory_mb(1025) == 1024


@pytest.mark.parametrize("text,why", [
    ("huge", "a preset"),
    ("sockets=2,flavour=3", "'flavour=3' is not one of"),
    ("sockets=0", "sockets=0: a count"),
    ("cores=x", "cores=x: a count"),
    ("sockets=2,sockets=2", "sockets= given twice"),
    ("sockets=8,cores=8,threads=2", "128 vCPUs, more than 64"),
    ("sockets=2,llc=cluster", "llc=cluster: choose socket|die"),
    ("sockets=2,llc=die", "llc=die needs dies=2"),
    ("dies=2,cores=2,llc=socket", "llc=socket cannot be made"),
    ("sockets=2,numa=3", "cannot be split evenly into 3 nodes"),
    ("sockets=1,cores=4,numa=2", "an LLC never spans nodes"),
    ("sockets=2,numa=per-core", "numa=per-core: per-socket"),
    ("sockets=2,distance=20", "distance= needs NUMA nodes"),
    ("sockets=2,numa=2,distance=5", "distance=5: a NUMA distance"),
])
def test_bad_specs_are_refused_in_one_line(text, why):
    with pytest.raises(ParameterError, match=why) as exc:
        vt.parse(text)
    assert "\n" not in str(exc.value)


def test_a_refusal_and_a_shape_count_their_units_in_words():
    """'2 LLCs', '1 LLC', never 'LLC(s)': the counts agree with their nouns (harmony.core.wording,
    light enough for the guest agent, which imports this module)."""
    with pytest.raises(ParameterError) as exc:
        vt.parse("sockets=2,numa=3")
    assert "numa=3: 2 LLCs cannot be split evenly into 3 nodes" in str(exc.value)
    with pytest.raises(ParameterError) as exc:
        vt.parse("sockets=1,cores=4,numa=2")
    assert "numa=2: 1 LLC cannot be split evenly into 2 nodes" in str(exc.value)
    assert "(s)" not in str(exc.value)
    assert vt.parse("sockets=1,cores=1").describe() == \
        "1 socket x 1 die x 1 core x 1 thread = 1 vCPU, LLC per socket, 1 NUMA node"


def test_node_memory_and_nr_cpus():
    with pytest.raises(ParameterError, match="each needs 128M"):
        vt.check_memory(vt.parse("2node"), 200)
    vt.check_memory(vt.parse("2node"), 512)
    assert vt.nr_cpus("CONFIG_X=y\nCONFIG_NR_CPUS=8192\n") == 8192
    assert vt.nr_cpus("CONFIG_X=y\n") is None


# the domains real guests built (tests/data/topology, captured under TCG) and the spec that
# made each: the rules of expected_spans() must give exactly those
BUILT = {
    "612-s2c2": "2socket",
    "61-s2c2": "2socket",
    "612-c2t2-intel": "smt",
    "61-c2t2-intel": "smt",
    "612-d2c2-intel": "2llc",
    "61-d2c2-intel": "2llc",
    "612-s2c2t2-numa": "2node-smt",         # 6.12 sees the threads even with AMD's vendor
    "61-s2c2t2-numa-intel": "2node-smt",
    "612-s2d2c2t2-numa-intel": "2node-2llc-smt",
    "61-s2d2c2t2-numa-intel": "2node-2llc-smt",
}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_expected_domains_are_the_ones_real_guests_built(name, tmp_path):
    topo = vt.parse(BUILT[name])
    guest = guest_topology(load(name), tmp_path)
    assert guest["domains"], guest["source"]
    got = {int(c): [sorted(d["span"]) for d in ds] for c, ds in guest["domains"].items()}
    assert got == {c: [sorted(s) for _, s in lv] for c, lv in topo.expected_spans().items()}
    assert vt.check(topo, guest) is None


def test_every_preset_was_built_by_both_kernels():
    presets = [BUILT[n] for n in BUILT]
    assert {p for p in vt.PRESETS if p != "2node"} <= set(presets)
    for p in set(presets) - {"2node-smt"}:
        assert sum(p == BUILT[n] for n in BUILT if n.startswith("61-")) == 1
        assert sum(p == BUILT[n] for n in BUILT if n.startswith("612-")) == 1


def test_a_die_split_under_amds_vendor_string_is_refused(tmp_path):
    # TCG's max with AMD's vendor string: neither kernel splits the LLC by die
    why = vt.check(vt.parse("dies=2,cores=2,cpu=max"), guest_topology(load("612-d2c2-max"),
                                                                       tmp_path))
    assert "CPU 0's domains are MC 0-3, not MC 0-1 < PKG 0-3" in why


def test_a_topology_the_guest_did_not_get_is_named_in_one_line(tmp_path):
    # Debian 6.1 under TCG's default CPU model sees no hardware threads: no SMT domain
    guest = guest_topology(load("61-s2c2t2-numa"), tmp_path)
    topo = vt.parse("sockets=2,cores=2,threads=2,numa=per-socket,cpu=max")
    why = vt.check(topo, guest)
    assert why and "\n" not in why
    assert "CPU 0's domains are MC 0-3 < NUMA 0-7, not SMT 0-1 < MC 0-3 < NUMA 0-7" in why
    assert "sees no hardware threads" in why
    # fewer CPUs than vCPUs
    assert "the guest has 4 CPUs online, not the 8 vCPUs" in vt.check(
        topo, guest_topology(load("612-s2c2"), tmp_path / "b"))


# --- the VM's command line, the plan, the guest's check ------------------------------------------

def test_the_vng_command_of_a_topology(monkeypatch):
    from pathlib import Path

    from harmony.vm import kernels, machine

    # a host whose virtiofs works: no --force-9p (tested where that is decided)
    monkeypatch.setattr(machine, "virtiofs_works", lambda: True)

    k = kernels.Kernel("debian:6.12", Path("/c/boot/vmlinuz-6.12"), "6.12", None, {})
    topo = vt.parse("2node-smt")
    argv = machine.vng_argv(k, 8, 1024, Path("/out"), ["agent"],
                            machine.QemuSetting.parse("tcg=single"), "tcg", topology=topo)
    assert argv == ["vng", "--verbose", "--run", "/c/boot/vmlinuz-6.12",
                    "--cpus", "8,sockets=2,cores=2,threads=2", "--numa", "512M,cpus=0-3",
                    "--numa", "512M,cpus=4-7", "--memory", "1024M", "--rwdir", "/out",
                    "--disable-kvm", "--qemu-opts=-name harmony,debug-threads=on "
                    "-accel tcg,thread=single -cpu max,vendor=GenuineIntel", "--", "agent"]
    # the VM takes the topology's vCPUs and whole nodes' memory, and its facts say the shape
    m = machine.VirtualMachine(k, 2, 1025, topology=topo)
    assert (m.vcpus, m.memory_mb) == (8, 1024)
    assert m.describe()["topology"]["spec"] == topo.spec()


def test_the_plan_takes_the_topologys_vcpus(monkeypatch):
    from harmony.vm import plan

    monkeypatch.setattr(plan, "missing_tools", lambda: [])
    p = plan.plan_vm("debian:6.12", None, "1G", None, vm_topology="2node")
    assert p.cpus == [0, 1, 2, 3] and p.topology.numa == 2 and p.memory_mb == 1024
    assert plan.plan_vm("debian:6.12", None, "1G", None).cpus == [0, 1, 2, 3]   # the default
    assert plan.plan_vm("debian:6.12", 4, "1G", None, vm_topology="2node").cpus == [0, 1, 2, 3]
    with pytest.raises(ParameterError, match="--vm-cpus 8 and --vm-topology 2node"):
        plan.plan_vm("debian:6.12", 8, "1G", None, vm_topology="2node")
    with pytest.raises(ParameterError, match="each needs 128M"):
        plan.plan_vm("debian:6.12", None, "256M", None, vm_topology="sockets=4,numa=4")


@pytest.mark.parametrize("name", sorted(BUILT))
def test_the_shape_planned_before_boot_is_the_one_real_guests_built(name, tmp_path):
    """A suite or a run placed by level is planned on the machine the shape implies (a
    synthetic machine's topology, harmony.analysis.machines) before the guest boots: its
    domains and the pairs it places at each level are those of the real guests."""
    from harmony.analysis.machines import machine_topology
    from harmony.experiments.placement import LEVELS, levels_present, placed_cpus

    topo = vt.parse(BUILT[name])
    planned = machine_topology(topo.machine_spec("6.1" if name.startswith("61-") else "6.12"))
    guest = guest_topology(load(name), tmp_path)
    assert ({c: [(d["name"], d["span"]) for d in ds] for c, ds in planned["domains"].items()}
            == {c: [(d["name"], d["span"]) for d in ds] for c, ds in guest["domains"].items()})
    for key in ("min_interval", "max_interval", "busy_factor", "imbalance_pct",
                "cache_nice_tries"):
        assert ([d[key] for d in planned["domains"]["0"]]
                == [d[key] for d in guest["domains"]["0"]]), key
    cpus = list(range(topo.vcpus))
    assert levels_present(cpus, planned) == levels_present(cpus, guest)
    for level in LEVELS:
        if level in levels_present(cpus, guest):
            assert placed_cpus(level, cpus, planned) == placed_cpus(level, cpus, guest)


def test_a_run_placed_by_level_in_a_vm_uses_the_shape(monkeypatch):
    from harmony.cli import measure
    from harmony.vm import plan

    monkeypatch.setattr(plan, "missing_tools", lambda: [])
    vm = plan.plan_vm("debian:6.12", None, "1G", None, vm_topology="2node")
    assert measure._placed({"level": "remote"}, vm.cpus, "debian:6.12", vm) == [0, 2]
    assert measure._placed({"level": "llc"}, vm.cpus, "debian:6.1", vm) == [0, 1]
    assert measure._placed({}, vm.cpus, "debian:6.12", vm) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="no SMT siblings"):
        measure._placed({"level": "smt"}, vm.cpus, "debian:6.12", vm)
    flat = plan.plan_vm("debian:6.12", 4, "1G", None)
    with pytest.raises(ValueError, match="needs the guest's shape before it boots"):
        measure._placed({"level": "llc"}, flat.cpus, "debian:6.12", flat)
    # a shape whose nodes the synthetic machines cannot say: no plan by level, said
    assert vt.parse("sockets=4,cores=1,numa=2").machine_spec() is None
    assert vt.parse("2node").machine_spec() == ("sockets=2,llcs=1,cores=2,threads=1,"
                                                "numa=socket,kernel=6.12")
    assert vt.parse("sockets=2,cores=2,numa=per-socket,distance=30").machine_spec().endswith(
        ",distance=10:30/30:10")


def test_more_vcpus_than_the_kernel_brings_up_are_refused(tmp_path):
    from harmony.vm import kernels, plan

    (tmp_path / "config-6.12-x").write_text("CONFIG_SMP=y\nCONFIG_NR_CPUS=8\n")
    k = kernels.Kernel("debian:6.12", tmp_path / "vmlinuz-6.12-x", "6.12-x", None, {})
    plan.check_kernel_cpus(k, 8)
    with pytest.raises(ParameterError, match=r"at most 8 CPUs \(CONFIG_NR_CPUS=8\): 16 vCPUs"):
        plan.check_kernel_cpus(k, 16)
    (tmp_path / "config-6.12-x").unlink()
    plan.check_kernel_cpus(k, 64)       # no config: nothing known, nothing refused


def test_a_topology_the_kernel_was_built_without_is_refused_before_the_boot(tmp_path):
    """A kernel built without CONFIG_SCHED_MC forms no MC level: a shape whose LLC level has
    spans of its own (2socket: MC 0-1 < PKG 0-3) is refused from the config, in one line that
    names the option; shapes where another level takes the same spans (smt: PKG 0-3 where MC
    would be; 2node: PKG 0-1 where MC would be) are what the guest gets, and pass."""
    import gzip

    from harmony.vm import kernels, plan

    config = "CONFIG_SMP=y\nCONFIG_SCHED_SMT=y\n# CONFIG_SCHED_MC is not set\nCONFIG_NUMA=y\n"
    (tmp_path / "config.gz").write_bytes(gzip.compress(config.encode()))
    k = kernels.Kernel("sched-ext", tmp_path / "bzImage", "6.12.117", None, {})
    with pytest.raises(ParameterError, match=r"^--vm-topology 2socket: kernel sched-ext was "
                       r"built without CONFIG_SCHED_MC, .*--kernel sched-ext-full has it$"):
        plan.check_kernel_topology(k, vt.parse("2socket"))
    for shape in ("smt", "2node"):
        plan.check_kernel_topology(k, vt.parse(shape))
    with pytest.raises(ParameterError, match="without CONFIG_SCHED_MC"):
        plan.check_kernel_topology(k, vt.parse("2node-2llc-smt"))
    (tmp_path / "config.gz").write_bytes(gzip.compress(
        config.replace("# CONFIG_SCHED_MC is not set", "CONFIG_SCHED_MC=y")
        .replace("CONFIG_SCHED_SMT=y", "").encode()))
    with pytest.raises(ParameterError, match=r"without CONFIG_SCHED_SMT, so its guests cannot "
                       r"form [^:]*$"):      # no hint: sched-ext-full would not help
        plan.check_kernel_topology(k, vt.parse("2node-smt"))
    plan.check_kernel_topology(k, vt.parse("2socket"))
    plan.check_kernel_topology(k, None)
    (tmp_path / "config.gz").unlink()
    plan.check_kernel_topology(k, vt.parse("2node-smt"))   # no config: nothing refused


def test_the_guest_refuses_a_topology_it_did_not_get_before_any_run(tmp_path):
    from harmony.vm import guest

    job = tmp_path / "job.json"
    guest.write_job(job, [], "2node-smt")
    topo = guest.job_topology(job)
    assert topo.preset == "2node-smt"
    got = guest_topology(load("612-s2c2t2-numa"), tmp_path / "a")
    assert guest.topology_problem(topo, {"doctor": {"sched_domains": got}}) is None
    got = guest_topology(load("61-s2c2t2-numa"), tmp_path / "b")
    why = guest.topology_problem(topo, {"doctor": {"sched_domains": got}})
    assert why.startswith("--vm-topology 2node-smt: the guest did not get") and "\n" not in why
    failed = {"status": "warn", "detail": "check failed: OSError: x"}
    assert "could not be read (check failed" in guest.topology_problem(
        topo, {"doctor": {"sched_domains": failed}})
    guest.write_job(job, [])
    assert guest.job_topology(job) is None
