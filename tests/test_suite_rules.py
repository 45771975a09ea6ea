"""The rules tests/conftest.py gives every test run, proved on small pytest runs in a subprocess:
a test that cannot run on this host skips with its reason, and fails in CI (CI=true, as root);
the kernel marker follows the kernel fixture; harmony must come from the checkout under test."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
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
            "harmony.probes.perf": module("harmony.probes.perf",
                                          str(tmp_path / "probes" / "perf.py")),
            "harmony.ns": module("harmony.ns", None, [str(tmp_path / "ns")]),
            "harmonyx": module("harmonyx", str(tmp_path / "harmonyx.py")),
            "numpy": module("numpy", str(tmp_path / "numpy.py"))}
    assert foreign_harmony_modules(mods) == [
        f"harmony.ns ({tmp_path / 'ns'})",
        f"harmony.probes ({tmp_path / 'probes' / '__init__.py'})",
        f"harmony.probes.perf ({tmp_path / 'probes' / 'perf.py'})"]
    assert foreign_harmony_modules() == []   # this run's own


def test_an_empty_parametrisation_fails_at_collection(tmp_path):
    """A parametrisation whose list came out empty (a glob over a corpus that is not there) is
    an error that stops the run, not one silent skip (setup.cfg: empty_parameter_set_mark)."""
    t = tmp_path / "test_empty.py"
    t.write_text("import pytest\n\nCORPUS = []\n\n\n@pytest.mark.parametrize('path', CORPUS)\n"
                 "def test_each_file(path):\n    pass\n")
    p = pytest_run(str(t), "--rootdir", str(ROOT), "-c", str(ROOT / "setup.cfg"), env=environ())
    out = p.stdout + p.stderr
    assert p.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "Empty parameter set in 'test_each_file'" in out and "skipped" not in out, out


#: what skips a test other than host_skip: pytest's own skips and expected failures, by the
#: dotted name they resolve to through the file's imports (unittest's too)
SKIP_BYPASSES = {"pytest.skip", "pytest.importorskip", "pytest.xfail", "pytest.mark.skip",
                 "pytest.mark.skipif", "pytest.mark.xfail", "pytest.skip.Exception",
                 "unittest.skip", "unittest.skipIf", "unittest.skipUnless", "unittest.SkipTest",
                 "unittest.TestCase.skipTest", "_pytest.outcomes.skip", "_pytest.outcomes.Skipped"}


def skip_bypasses(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every use of a :data:`SKIP_BYPASSES` name in a Python file's code,
    read from its syntax tree: a call, a decorator, a mark given to pytest.param or to
    ``pytestmark``, an exception raised; through ``import pytest as pt`` and ``from pytest
    import skip`` as well; written over several lines or not. Strings and comments that name
    them are not code."""
    tree = ast.parse(source)
    alias: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:        # import a.b binds a; import a.b as c binds a.b
                top = a.name.split(".")[0]
                alias[a.asname or top] = a.name if a.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"

    def dotted(node) -> str | None:
        if isinstance(node, ast.Name):
            return alias.get(node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    found = []
    for node in ast.walk(tree):
        name = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if name is None and isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "getattr" and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant):
            base = dotted(node.args[0])
            name = base and f"{base}.{node.args[1].value}"
        if name in SKIP_BYPASSES:
            found.append((node.lineno, name))
    # an attribute chain is visited whole and by its parts: pytest.skip.Exception names
    # pytest.skip too; one line, one name (the longest) suffices to say where
    best: dict[int, str] = {}
    for line, name in found:
        if len(name) > len(best.get(line, "")):
            best[line] = name
    return sorted(best.items())


def test_the_skip_lint_reads_code_not_lines():
    code = textwrap.dedent("""\
        import pytest as pt
        import unittest
        from pytest import mark, skip as leave
        \"\"\"pytest.skip("in a docstring") is no skip\"\"\"
        # nor pytest.mark.skipif in a comment
        pytestmark = mark.skipif(True, reason="r")

        @pt.mark.\\
            xfail
        def test_a():
            leave(
                "x")

        @pt.mark.parametrize("v", [pt.param(1, marks=pt.mark.skip)])
        def test_b(v):
            raise unittest.SkipTest("y")

        def test_c():
            getattr(pt, "skip")("z")
            with pt.raises(pt.skip.Exception):
                pass
        """)
    assert skip_bypasses(code) == [
        (6, "pytest.mark.skipif"), (8, "pytest.mark.xfail"), (11, "pytest.skip"),
        (14, "pytest.mark.skip"), (16, "unittest.SkipTest"), (19, "pytest.skip"),
        (20, "pytest.skip.Exception")]
    assert skip_bypasses("x = 'pytest.skip(1)'\nimport pytest\npytest.fail('no')\n") == []


def test_every_skip_goes_through_host_skip():
    """A skip written another way would pass CI quietly: pytest.skip, skipif, importorskip and
    xfail are used by conftest.py alone (and this file's own check of host_skip, which catches
    pytest's skip exception)."""
    allowed = {("test_suite_rules.py", "pytest.skip.Exception")}
    found = [f"{p.name}:{line}: {name}" for p in sorted((ROOT / "tests").glob("*.py"))
             if p.name != "conftest.py"
             for line, name in skip_bypasses(p.read_text()) if (p.name, name) not in allowed]
    assert found == []
