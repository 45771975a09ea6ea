"""harmony.core.memory: Harmony's entry points (the ``harmony`` command, the suite's analyser, the
benchmarks) stop numpy's huge-page requests (measured 1.3-1.5x faster decoding on a VM) and keep
freed memory for the next arrays, unless numpy's own switch, or glibc's malloc parameters, are set
in the environment; importing Harmony's packages changes neither."""

import json
import os
import subprocess
import sys

import pytest
from conftest import host_skip

#: what a process does before the check: start the `harmony` command (its group callback runs
#: first: a `list` is the cheapest command), or only import a package
START = {"cli": ("import contextlib, io\nfrom harmony.cli import main\n"
                 "with contextlib.redirect_stdout(io.StringIO()):\n"
                 "    main(['list'], standalone_mode=False)\n"),
         "probes": "import harmony.probes\n", "analysis": "import harmony.analysis\n"}

CHECK = ("{start}"
         "try:\n    from numpy._core import multiarray\n"
         "except ImportError:\n    from numpy.core import multiarray\n"
         "print(multiarray._get_madvise_hugepage())")


def _flag(mod: str, **env) -> str:
    base = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    out = subprocess.run([sys.executable, "-c", CHECK.format(start=START[mod])], env=base | env,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_command_turns_numpy_huge_pages_off():
    assert _flag("cli") == "False"


@pytest.mark.parametrize("mod", ["probes", "analysis"])
def test_importing_a_package_leaves_numpy_as_it_was(mod):
    assert _flag(mod) == "True"


def test_numpy_switch_set_by_the_user_wins():
    assert _flag("cli", NUMPY_MADVISE_HUGEPAGE="1") == "True"


REUSE = ("import resource\nimport numpy as np\n{start}"
         "def minflt():\n    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
         "def faults(n):\n    a = np.empty(n, np.uint8)\n    f = minflt()\n"
         "    a[::4096] = 1\n    return minflt() - f\n"
         "faults(16 << 20)\nprint(faults(16 << 20))")


def _refaults(mod: str, mib: int = 16, **env) -> int:
    """Pages faulted in by a ``mib`` MiB array allocated after one like it was freed."""
    base = {k: v for k, v in os.environ.items()
            if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}
    code = REUSE.format(start=START[mod]).replace("16 << 20", f"{mib} << 20")
    out = subprocess.run([sys.executable, "-c", code], env=base | env, capture_output=True,
                         text=True, check=True)
    return int(out.stdout)


def test_the_command_keeps_freed_memory_for_the_next_arrays():
    # glibc's default maps a first 16 MiB array, then (its threshold raised) puts the second in
    # fresh heap memory: ~4096 faults. Kept, the second reuses the first's pages.
    assert _refaults("cli") < 512


@pytest.mark.parametrize("mod", ["probes", "analysis"])
def test_importing_a_package_leaves_malloc_as_it_was(mod):
    code = START[mod] + "from harmony.core import memory\nprint(memory._kept)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"      # mallopt was never called


def test_arrays_past_glibcs_mapping_threshold_are_reused_too():
    # 64 MiB: beyond the 32 MiB up to which glibc can be told to use its heap; by default each
    # such array is mapped, then unmapped when freed (16384 fresh pages for the second)
    assert _refaults("cli", mib=64) < 512
    assert _refaults("cli", mib=64, GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072") \
        > 12000


def test_malloc_parameters_set_by_the_user_win():
    assert _refaults("cli", GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072") > 3000


PREFAULT = ("import json, resource, time\nimport numpy as np\n"
            "from harmony.core import memory\nmemory.tune_allocations()\n"
            "def minflt():\n    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "thread = memory.prefault_heap({mib} << 20)\n"
            "policy = set()\n"
            "while thread is not None and thread.is_alive():\n"
            "    for line in open(f'/proc/self/task/{{thread.native_id}}/sched'):\n"
            "        if line.startswith('policy'):\n"
            "            policy.add(int(line.split(':')[1]))\n"
            "    {after_start}\n"
            "    time.sleep(0.001)\n"
            "memory.stop_prefault()\n"
            "f = minflt()\n"
            "a = np.empty(96 << 20, np.uint8)\n"
            "a[::4096] = 1\n"
            "print(json.dumps([thread is not None, sorted(policy), minflt() - f]))")


def _prefault(mib: int = 128, after_start: str = "pass", **env) -> tuple[bool, list, int]:
    """(thread started, SCHED policies seen on it, page faults of a 96 MiB array made after)."""
    base = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "HARMONY_PREFAULT")
            and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PREFAULT.format(mib=mib, after_start=after_start)],
                         env=base | env, capture_output=True, text=True, check=True)
    started, policy, faults = json.loads(out.stdout)
    return started, policy, faults


def test_prefaulted_heap_memory_is_not_faulted_in_again():
    # 96 MiB of fresh pages is 24576 faults; the prefaulted heap holds them already
    started, policy, faults = _prefault()
    assert started
    assert faults < 2000
    assert os.SCHED_IDLE in policy   # (0 may be seen before the thread has set it)


def test_prefault_off_by_environment_or_when_malloc_is_tuned_by_the_user():
    for env in ({"HARMONY_PREFAULT": "0"},
                {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1073741824"}):
        started, _, faults = _prefault(**env)
        assert not started
        assert faults > 20000


def test_stop_prefault_stops_the_thread_at_once():
    # stopped right after it starts, 800 MiB are not populated: the array faults its pages in
    # (unstopped, it would find them populated: < 2000 faults). How much the thread populated
    # before the stop reached it is the host's timing (CI once: 19,457 of the 24,576 pages
    # faulted, ~20 MiB populated first): half the array is the line
    started, _, faults = _prefault(mib=800, after_start="memory.stop_prefault()")
    assert started
    assert faults > 24576 // 2


def test_a_new_prefault_stops_the_previous_one():
    from harmony.core import memory
    memory.tune_allocations()    # sets malloc's parameters, which the prefault needs
    if not memory._kept:
        host_skip("malloc parameters set by the environment: no prefault")
    first = memory.prefault_heap(512 << 20)
    second = memory.prefault_heap(64 << 20)
    try:
        assert first is not None and second is not None
        assert not first.is_alive()          # stopped, not left to populate beside the second
        assert [t for t, _ in memory._prefaults] == [second]
    finally:
        memory.stop_prefault()
    assert not second.is_alive() and memory._prefaults == []


def test_stop_prefault_passes_over_a_thread_whose_start_was_interrupted(monkeypatch):
    """A Ctrl-C inside prefault_heap's thread.start() leaves a thread registered that never ran:
    stopping the prefaults then must not try to join it (RuntimeError: a run stopped by Ctrl-C
    exited 1 instead of 130)."""
    import threading
    from harmony.core import memory
    never = threading.Thread(target=lambda: None, daemon=True)
    stop = threading.Event()
    monkeypatch.setattr(memory, "_prefaults", [(never, stop)])
    memory.stop_prefault()
    assert stop.is_set() and memory._prefaults == []


DESCRIBE = ("import json\nfrom harmony.core import memory\nmemory.tune_allocations()\n"
            "ok, detail = memory.describe()\n"
            "print(json.dumps([ok, detail, memory.prefault_heap(128 << 20) is not None]))")


@pytest.mark.parametrize("env", [{}, {"HARMONY_PREFAULT": "0"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1073741824"}])
def test_doctor_line_says_whether_decodes_are_prefaulted(env):
    base = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "HARMONY_PREFAULT")
            and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", DESCRIBE], env=base | env, capture_output=True,
                         text=True, check=True)
    ok, detail, started = json.loads(out.stdout)
    assert ok == started        # what the doctor says is what a decode does
    if env:
        assert not ok and "as they go" in detail


ARROW = "{start}import pyarrow as pa\nprint(pa.default_memory_pool().backend_name)"


def _arrow_pool(start: str, **env) -> str:
    base = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", ARROW.format(start=start)], env=base | env,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_command_has_arrow_allocate_with_malloc():
    assert _arrow_pool(START["cli"]) == "system"


def test_the_pool_is_set_even_once_pyarrow_is_loaded():
    start = ("import pyarrow as pa\nassert pa.default_memory_pool().backend_name != 'system'\n"
             "from harmony.core import memory\nmemory.tune_allocations()\n")
    if _arrow_pool("") == "system":
        host_skip("this pyarrow's default pool is the system's already")
    assert _arrow_pool(start) == "system"


@pytest.mark.parametrize("mod", ["probes", "analysis"])
def test_importing_a_package_leaves_arrows_pool_as_it_was(mod):
    assert _arrow_pool(START[mod]) == _arrow_pool("")


def test_arrows_pool_set_by_the_user_wins():
    theirs = next(p for p in __import__("pyarrow").supported_memory_backends() if p != "system")
    assert _arrow_pool(START["cli"], ARROW_DEFAULT_MEMORY_POOL=theirs) == theirs
