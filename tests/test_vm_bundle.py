"""The guest agent's bundle (harmony.vm.bundle): a zip of Harmony and the standard modules the agent
imports, which a child started as the agent is (``-S -P``) imports from instead of the tree, and
the guest's command that copies it first. No VM: the command runs here, its copy in tmp_path."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

from harmony.core.osutil import harmony_python
from harmony.vm import bundle

#: what the child prints: where harmony, a standard package and one of its modules the agent does
#: not import came from, and a module of the agent's
PROBE = ("import json, sys, harmony, importlib.metadata, harmony.vm.guest, "
         "harmony.workload.forkserver; print(json.dumps({m: sys.modules[m].__file__ for m in "
         "('harmony', 'importlib', 'importlib.metadata', 'harmony.vm.guest', 'json')}))")


def test_the_bundle_holds_every_harmony_module_and_the_agents_standard_ones(tmp_path):
    path = bundle.write_bundle(tmp_path)
    assert path == tmp_path / bundle.NAME
    names = set(zipfile.ZipFile(path).namelist())
    # Harmony whole, wherever its subpackages sit (beside harmony/ in a source tree)
    for mod in ("harmony/__init__.pyc", "harmony/vm/guest.pyc", "harmony/probes/tracefs.pyc",
                "harmony/analysis/policy.pyc", "harmony/cli/__init__.pyc"):
        assert mod in names
    # a standard package the agent imports, whole: its modules the agent did not import too
    assert {"importlib/__init__.pyc", "importlib/metadata/__init__.pyc",
            "json/__init__.pyc", "json/tool.pyc"} <= names
    assert not any(n.startswith(("numpy/", "pandas/")) for n in names)


def test_a_child_started_as_the_agent_imports_from_the_copied_bundle(tmp_path):
    (tmp_path / "job").mkdir()
    made = bundle.write_bundle(tmp_path / "job")
    copy = tmp_path / "guest-tmp" / bundle.NAME
    copy.parent.mkdir()
    _, env = harmony_python("harmony.vm.guest", site=False)
    command = bundle.guest_command(made, [f"PYTHONPATH={env['PYTHONPATH']}"],
                                   [sys.executable, "-S", "-P", "-c", PROBE], dest=copy)
    out = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    where = json.loads(out.stdout)
    assert copy.is_file()
    inside = str(copy) + "/"
    assert all(f.startswith(inside) for f in where.values()), where
    assert where["importlib.metadata"] == inside + "importlib/metadata/__init__.pyc"


def test_without_its_bundle_or_its_copy_the_agent_imports_from_the_tree(tmp_path):
    _, env = harmony_python("harmony.vm.guest", site=False)
    argv = [sys.executable, "-S", "-P", "-c", PROBE]
    env_items = [f"PYTHONPATH={env['PYTHONPATH']}"]
    # no bundle made: the command as before
    assert bundle.guest_command(None, env_items, argv) == ["env", *env_items, *argv]
    # a bundle whose copy fails (its directory is missing): the tree, and no half copy left
    missing = tmp_path / "no-such-dir" / bundle.NAME
    command = bundle.guest_command(tmp_path / "gone.zip", env_items, argv, dest=missing)
    out = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    where = json.loads(out.stdout)
    assert ".zip" not in where["harmony"] and not missing.exists()
