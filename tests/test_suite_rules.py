"""The rules tests/conftest.py gives every test run, proved on small pytest runs in a subprocess:
a test that cannot run on this host skips with its reason, and fails in CI (CI=true, as root);
the kernel marker follows the kernel fixture; harmony must come from the checkout under test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import pytest
from conftest import NO_KERNEL_ENV, ROOT, foreign_harmony_modules, host_skip

#: a kernel test (through the fixture only, no marker of its own) that starts nothing when the
#: kernel is unavailable
KERNEL_TEST = "tests/test_ringbuf.py::test_real_kernel_formats_parse"


def pytest_run(*args, env: dict, cwd=ROOT) -> subprocess.CompletedProcess:
    """``python -m pytest -q ARGS`` as the README runs it (no -rs: setup.cfg must add it)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def environ(**changes) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", NO_KERNEL_ENV)}
    env.update(changes)
    return env


def test_a_ci_run_where_the_kernel_tests_cannot_run_fails():
    why = "made unavailable by test_suite_rules"
    p = pytest_run(KERNEL_TEST, env=environ(CI="true", **{NO_KERNEL_ENV: why}))
    out = p.stdout + p.stderr
    reason = f"{NO_KERNEL_ENV} is set ({why}): the kernel is not used"
    assert reason in out, out
    if os.geteuid() == 0:
        assert p.returncode == 1, out
        assert "CI=true as root, where every test must run: " + reason in out
        assert "3 failed" in out or "3 error" in out, out   # one per decoder of the file
    else:  # CI's rule is for CI as root: elsewhere the kernel tests skip
        assert p.returncode == 0 and "3 skipped" in out, out


def test_elsewhere_the_kernel_tests_skip_and_say_why():
    why = "made unavailable by test_suite_rules"
    p = pytest_run(KERNEL_TEST, env=environ(**{NO_KERNEL_ENV: why}))
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "3 skipped" in out, out
    # -rs comes from setup.cfg: the reason is printed with the place it was given
    assert "SKIPPED [3] tests/conftest.py" in out and f"{NO_KERNEL_ENV} is set ({why})" in out, out


def test_host_skip_skips_elsewhere_and_fails_in_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="^no frobnicator$"):
        host_skip("no frobnicator")
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(pytest.fail.Exception,
                       match="^CI=true as root, where every test must run: no frobnicator$"):
        host_skip("no frobnicator")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)     # CI as a user: kernel tests cannot run
    with pytest.raises(pytest.skip.Exception, match="^no frobnicator$"):
        host_skip("no frobnicator")


def test_the_kernel_marker_follows_the_fixture():
    def collected(marks):
        p = pytest_run("--collect-only", "-m", marks, env=environ())
        assert p.returncode == 0, p.stdout + p.stderr
        return {ln for ln in p.stdout.splitlines() if "::" in ln}

    kernel, hermetic = collected("kernel"), collected("not kernel")
    assert kernel and hermetic and not kernel & hermetic
    # marked through the fixture alone, directly or through another fixture
    assert {f"{KERNEL_TEST}[{d}]" for d in ("compiled", "threads", "numpy")} <= kernel
    assert "tests/test_run_kernel.py::test_nothing_left_behind_after_a_normal_run" in kernel
    assert "tests/test_perf_probe.py::test_kernel_crosscheck_probes_agree" in kernel
    # and a hermetic test of a kernel test file is not
    assert "tests/test_crosscheck_kernel.py::test_bad_expert_option_is_one_line" in hermetic


def test_a_harmony_from_elsewhere_stops_the_run(tmp_path):
    fake = tmp_path / "harmony"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    # run from tmp_path: `python -m` puts the current directory first on sys.path
    p = pytest_run(str(ROOT / "tests" / "test_store.py"), "--rootdir", str(ROOT),
                   "-c", str(ROOT / "setup.cfg"), env=environ(), cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert "harmony modules come from outside the checkout under test" in out
    assert f"harmony ({fake / '__init__.py'})" in out and "passed" not in out


def test_foreign_modules_are_named_with_their_files(tmp_path):
    def module(name, file=None, path=None):
        m = types.ModuleType(name)
        m.__file__ = file
        if path is not None:
            m.__path__ = path
        return m

    mods = {"harmony": module("harmony", str(ROOT / "harmony" / "__init__.py")),
            "harmony.probes": module("harmony.probes", str(tmp_path / "probes" / "__init__.py")),
            "harmony.probes.perf": module("harmony.probes.perf", str(tmp_path / "probes" / "perf.py")),
            "harmony.ns": module("harmony.ns", None, [str(tmp_path / "ns")]),
            "harmonyx": module("harmonyx", str(tmp_path / "harmonyx.py")),
            "numpy": module("numpy", str(tmp_path / "numpy.py"))}
    assert foreign_harmony_modules(mods) == [
        f"harmony.ns ({tmp_path / 'ns'})",
        f"harmony.probes ({tmp_path / 'probes' / '__init__.py'})",
        f"harmony.probes.perf ({tmp_path / 'probes' / 'perf.py'})"]
    assert foreign_harmony_modules() == []   # this run's own


def test_every_skip_goes_through_host_skip():
    """A skip written another way would pass CI quietly: pytest.skip, skipif, importorskip and
    xfail are used by conftest.py alone."""
    bypass = re.compile(r"pytest\.(skip\(|importorskip|xfail)|mark\.(skipif|skip\b|xfail)")
    found = [f"{p.name}:{i}: {line.strip()}" for p in sorted((ROOT / "tests").glob("*.py"))
             if p.name != "conftest.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if bypass.search(line)]
    assert found == []
