"""Harmony runs as root: what it creates is never reached through a link someone planted, never
writable by others; no input is executed or evaluated; subprocesses take argv lists; a user who is
not root gets one line saying why a command cannot run, and the doctor says what they can do."""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path
from unittest import mock

import pytest
from click.testing import CliRunner
from conftest import host_skip

from harmony import hygiene, store
from harmony.cli import main
from harmony.core import osutil
from harmony.core.errors import HostBusy, RunError

ROOT = Path(__file__).resolve().parent.parent


def test_own_dir_is_made_0755_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        d = osutil.own_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o755


def test_own_dir_refuses_a_planted_link(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "lock").symlink_to(target)
    with pytest.raises(OSError, match=f"^{tmp_path / 'lock'} is a symbolic link \\(to {target}\\): "
                                      "not followed$"):
        osutil.own_dir(tmp_path / "lock")


def test_own_dir_refuses_a_directory_others_may_write_in(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(OSError, match="is writable by others \\(mode 777\\)"):
        osutil.own_dir(d)
    with pytest.raises(RunError, match="is writable by others"):
        store.make_run_dir(d)


def test_a_lock_directory_must_be_ours_a_run_directory_need_not(tmp_path):
    if os.geteuid() != 0:
        host_skip("chown to another user needs root")
    d = tmp_path / "theirs"
    d.mkdir(mode=0o755)
    os.chown(d, 65534, 65534)
    with pytest.raises(OSError, match=f"owned by uid 65534, not by this user \\({os.geteuid()}\\)"):
        osutil.own_dir(d)
    assert store.make_run_dir(d) == d          # a user's own directory, for root to write in


def test_the_host_lock_is_not_taken_through_a_planted_link(tmp_path, monkeypatch):
    target = tmp_path / "victim"
    target.mkdir()
    planted = tmp_path / "harmony"
    planted.symlink_to(target)
    monkeypatch.setattr(osutil, "LOCK_DIRS", (planted,))
    with pytest.raises(HostBusy, match="cannot take the host lock: no lock directory: .* is a "
                                       "symbolic link"):
        hygiene.HostLock().acquire()
    assert list(target.iterdir()) == []       # nothing written where the link points


def test_a_lock_file_that_is_a_link_is_not_opened(tmp_path):
    (tmp_path / "run.lock").symlink_to(tmp_path / "x")
    with pytest.raises(OSError):
        osutil.open_own_file(tmp_path / "run.lock")
    assert not (tmp_path / "x").exists()


def test_a_run_directory_is_not_written_through_a_planted_link(tmp_path):
    target = tmp_path / "etc"
    target.mkdir()
    (tmp_path / "out").symlink_to(target)
    with pytest.raises(RunError, match="is a symbolic link"):
        store.make_run_dir(tmp_path / "out")
    r = CliRunner().invoke(main, ["simulate", "--policy", "poly-balance", "--experiment",
                                  "single-source", "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "is a symbolic link: Harmony does not write through one" in r.output
    assert list(target.iterdir()) == []


def test_a_suite_or_matrix_refused_at_a_planted_link_writes_nothing_through_it(tmp_path):
    """A suite's and a matrix's directory refused as a link (their library calls, which check
    no --out as the CLI does): the file they would mark on their way out, found where the link
    points, is left as it was."""
    from harmony import matrix
    from harmony.runners import SimRunner
    from harmony.suite import plan, run_suite

    from test_matrix import plan_file

    target = tmp_path / "theirs"
    target.mkdir()
    for name in ("suite.json", "matrix.json"):
        (target / name).write_text('{"status": "running"}')
    (tmp_path / "out").symlink_to(target)
    with pytest.raises(RunError, match="is a symbolic link"):
        run_suite(plan([0, 1], quick=True, experiments=["single-source"]), [0, 1],
                  tmp_path / "out", SimRunner("poly-balance"), quiet=True)
    with pytest.raises(RunError, match="is a symbolic link"):
        matrix.run_local(matrix.load_plan(plan_file(tmp_path)), tmp_path / "out", resume=True,
                         quiet=True)
    assert sorted(p.name for p in target.iterdir()) == ["matrix.json", "suite.json"]
    for name in ("suite.json", "matrix.json"):
        assert (target / name).read_text() == '{"status": "running"}'


#: calls that run or evaluate what they are given: (module or "", function)
FORBIDDEN_CALLS = {("", "eval"), ("", "exec"), ("os", "system"), ("os", "popen"),
                   ("pickle", "load"), ("pickle", "loads"), ("marshal", "load"),
                   ("marshal", "loads"), ("yaml", "load")}


def test_no_input_is_executed_unpickled_or_evaluated_and_subprocesses_take_argv_lists():
    bad = []
    for folder in ("harmony", "probes", "analysis", "experiments"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                call = (("", f.id) if isinstance(f, ast.Name) else
                        (f.value.id if isinstance(f.value, ast.Name) else "?", f.attr)
                        if isinstance(f, ast.Attribute) else ("?", "?"))
                if call in FORBIDDEN_CALLS:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} "
                               f"{'.'.join(call).strip('.')}")
                for kw in node.keywords:     # a command line given to a shell
                    if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant)
                                                  and kw.value.value is False):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} shell=")
    assert bad == []


@pytest.fixture
def not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)


@pytest.mark.parametrize("args,says", [
    (["run", "single-source", "--duration", "1"], "probe tracefs cannot record here: the tracefs "
                                                  "probe needs root"),
    (["suite", "--quick"], "probe tracefs cannot record here: the tracefs probe needs root"),
    (["clean"], "clean needs root"),
])
def test_without_root_a_command_that_needs_it_says_why_in_one_line(not_root, tmp_path, args, says):
    r = CliRunner().invoke(main, args + (["--out", str(tmp_path / "o")]
                                         if args[0] != "clean" else []))
    assert r.exit_code == 1
    [line] = r.output.strip().splitlines()
    assert line.startswith("harmony: error: ") and says in line and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_the_doctor_says_what_a_user_who_is_not_root_can_do(not_root):
    from harmony.doctor import WITHOUT_ROOT, doctor
    with mock.patch("harmony.hostfacts.is_root", return_value=False):
        facts = doctor(mount=False, test_record=False)
    assert not facts["verdict"]["can_run"]
    [why] = [r for r in facts["verdict"]["reasons"] if r.startswith("not running as root")]
    assert why.endswith("without it: " + ", ".join(WITHOUT_ROOT))
    assert "import" in why and "simulate" in why and "compare" in why
