"""sched_ext schedulers under test for real: the sched-ext kernel (harmony kernel build sched-ext;
the cache seeded from the reference build beside the checkout when its configuration matches)
booted at P = 4, single-source run under scx_simple, and a scheduler the kernel ejects mid-run
(sysrq-S) marking its run incomplete with the reason.

They need QEMU, virtme-ng and busybox (install.sh) and the sched-ext kernel: built, or seeded
from ``../shared/kernels/`` (or HARMONY_KERNEL_SEED); they skip with the reason where those are
missing, and fail in CI."""

from __future__ import annotations

import pytest
from cli_run import cli
from conftest import host_skip, pids_with_comm

from harmony import store
from harmony.vm import kernels

VM_TOOLS = ("qemu-system-x86_64", "vng", "busybox")


@pytest.fixture(scope="module")
def sched_ext_kernel():
    try:
        return kernels.kernel("sched-ext")
    except kernels.KernelError as exc:
        host_skip(f"no sched-ext kernel: {exc}")


#: the quick suite's experiments the card's answers on scx_simple rest on
CARD_EXPERIMENTS = ["single-source", "how-many", "intrinsic-imbalance", "heavy-light", "detection",
                    "time-to-resolve"]


@pytest.fixture(scope="module")
def scx_simple_suite(sched_ext_kernel, tmp_path_factory):
    """The quick suite's experiments the card rests on, under scx_simple at P = 4 in one boot,
    one run each (the card's vote needs no repetition; a boot and a second round cost ~2 min of
    CI): the single-source run's manifest and the card are both checked from it."""
    out = tmp_path_factory.mktemp("scx") / "s"
    p = cli("suite", "--quick", "--repeat", "1", "--kernel", "sched-ext", "--vm-cpus", "4",
            "--scx", "simple", *[a for e in CARD_EXPERIMENTS for a in ("--experiment", e)],
            "--out", out, "-q", timeout=1800)
    return p, out


@pytest.mark.needs_tool(*VM_TOOLS)
def test_single_source_under_scx_simple_at_4_vcpus(kernel, sched_ext_kernel, scx_simple_suite):
    p, suite = scx_simple_suite
    assert p.returncode == 0, p.stderr
    out = suite / "single-source" / "rep-01"
    m = store.read_json(out / "manifest.json")
    assert m["status"] == "complete"
    s = m["scx"]
    assert s["name"] == "simple" and s["ops"] == "simple" and s["enabled_throughout"]
    assert s["states"] == [[0.0, "enabled"]] and s["ejected"] is None
    # a suite keeps the scheduler loaded across its runs: each run's record says since which run,
    # and that it was still enabled when the run ended (how a lone run's scheduler ends, and an
    # ejected one: the test below)
    assert s["kept"] and s["exit"] is None and s["state_after"] == "enabled", s
    assert s["path"] == str(sched_ext_kernel.image.parent / "scx_simple")
    assert m["under_test"]["scheduler"] == "simple" and m["under_test"]["ncpus"] == 4
    assert m["vm"]["kernel"]["spec"] == "sched-ext"
    # no occupier spins under sched_ext: the release is warm (or confined)
    assert m["release_mode"] in ("warm", "confined")
    assert m["kernel_counter_agreement"]["disagreeing"] == 0
    r = cli("report", out, "--out", suite / "single-source-report", "-q")
    assert r.returncode == 0, r.stderr
    assert "enabled throughout" in (suite / "single-source-report" / "report.md").read_text()
    # the suite's end: the scheduler it kept was stopped as a lone run's is, and the guest's
    # sched_ext state file read "disabled" after it
    ended = store.read_json(suite / "suite.json").get("scheduler_ended")
    assert ended and len(ended) == 1, ended
    assert ended[0]["ops"] == "simple" and ended[0]["state_after"] == "disabled", ended
    assert ended[0]["exit"] == "unregistered from user space", ended
    assert not pids_with_comm("scx_")


@pytest.mark.needs_tool(*VM_TOOLS)
def test_an_ejected_scheduler_marks_the_run_incomplete(kernel, sched_ext_kernel, tmp_path):
    """A scheduler the kernel ejects mid-run (sysrq-S, as a stall would): the run is incomplete
    and says why, in the scheduler's own words."""
    simple = sched_ext_kernel.image.parent / "scx_simple"
    ejecting = tmp_path / "scx_ejected"
    ejecting.write_text(f"#!/bin/sh\n(sleep 3; echo S > /proc/sysrq-trigger) &\n"
                        f"exec {simple} \"$@\"\n")
    ejecting.chmod(0o755)
    # the guest sees /tmp but not the kernel cache (/var/cache is a tmpfs there): a copy
    (tmp_path / "scx_simple").write_bytes(simple.read_bytes())
    (tmp_path / "scx_simple").chmod(0o755)
    ejecting.write_text(ejecting.read_text().replace(str(simple), str(tmp_path / "scx_simple")))
    out = tmp_path / "r"
    p = cli("run", "single-source", "--kernel", "sched-ext", "--vm-cpus", "4", "--scx",
            ejecting, "--layout", "8,0,0,0", "--duration", "4", "--out", out, "-q", timeout=900)
    assert p.returncode == 1
    m = store.read_json(out / "manifest.json")
    assert m["status"] == "incomplete"
    assert "ejected during the run" in m["incomplete_reason"], m["incomplete_reason"]
    assert "sysrq" in m["incomplete_reason"]
    assert not m["scx"]["enabled_throughout"] and "sysrq" in m["scx"]["ejected"]
    # one error line, in the scheduler's own words; beside it only notes (the kernel's, where
    # Debian's source has moved past the build) and what can still be done with the run
    lines = p.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("harmony: error:")]
    assert len(errors) == 1 and "sysrq" in errors[0], lines
    assert all(line in errors or line.startswith(("note: ", "harmony: what it captured"))
               for line in lines), lines


@pytest.mark.needs_tool(*VM_TOOLS)
def test_the_card_reads_scx_simple_as_the_global_queue_it_is(kernel, sched_ext_kernel,
                                                              scx_simple_suite):
    """Ground truth on a real kernel: scx_simple keeps one queue that every CPU takes from (its
    default mode, weighted vtime), so the card must find weak affinity, read how-many as a global
    queue, and answer time-to-balance, busy-CPU detection and selection as not applicable."""
    p, out = scx_simple_suite
    assert p.returncode == 0, p.stderr
    card = store.read_json(out / "card.json")
    assert not card["skipped"], card["skipped"]      # every run used: the vCPUs were not starved
    assert set(card["setups"]) == {"6.12.117, simple"}, card["setups"]
    got = {a["qid"]: a["label"] for a in card["answers"]}
    assert got["affinity"] == "weak" and got["how_many"] == "global-queue", got
    for qid in ("time_to_balance", "detection", "selection"):
        assert got[qid] == "not applicable (global queue)", (qid, got)
    assert not pids_with_comm("scx_")


@pytest.fixture(scope="module")
def rust_kernel():
    """The kernel the Rust schedulers need (built if missing: ~11 min here) and the schedulers
    (`harmony scx build`: 1-3 min each)."""
    try:
        kernels.kernel("sched-ext-full")
    except kernels.KernelError:
        kernels.build("sched-ext-full")
    p = cli("scx", "build", timeout=3600)
    assert p.returncode == 0, p.stderr


@pytest.mark.long_build
@pytest.mark.needs_tool(*VM_TOOLS)
@pytest.mark.parametrize("name", ["bpfland", "rusty"])  # lavd 1.1.4: not on 6.12 (docs/kernels.md)
def test_a_rust_scheduler_built_from_its_crate_runs_enabled_throughout(kernel, rust_kernel, name,
                                                                      tmp_path):
    """The scx project's Rust schedulers, built by `harmony scx build` from their crates, on the
    kernel with the function tracer they need (sched-ext-full), at P = 4. Not in the
    README's test command (CI's 30 minutes cannot hold both builds): `pytest -m long_build`."""
    out = tmp_path / "r"
    p = cli("run", "single-source", "--kernel", "sched-ext-full", "--vm-cpus", "4", "--scx",
            name, "--layout", "8,0,0,0", "--duration", "3", "--out", out, "-q", timeout=900)
    assert p.returncode == 0, p.stderr
    m = store.read_json(out / "manifest.json")
    s = m["scx"]
    assert m["status"] == "complete" and s["enabled_throughout"] and s["name"] == name
    assert m["under_test"]["ncpus"] == 4 and m["kernel_counter_agreement"]["disagreeing"] == 0
    assert not pids_with_comm("scx_")
