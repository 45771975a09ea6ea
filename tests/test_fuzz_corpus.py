"""The fuzz targets' saved corpus, replayed (fuzz/run.py TARGET --replay): CI's short pass.

Every input saved in fuzz/corpus/<target>/ (seeds from real captures, inputs fuzzing found new
coverage with, and the input of every finding, regress-*) goes once through its target, in a
process of its own: it must decode or raise Harmony's one-line error naming the file, within the
time and memory a fuzz campaign allows an input (fuzz/run.py). The fuzzer itself (atheris) is
checked to run a target briefly; the campaigns are run by hand (fuzz/README.md).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import ROOT, host_skip

FUZZ = ROOT / "fuzz"
sys.path.insert(0, str(FUZZ))

from targets import TARGETS, pack, unpack  # noqa: E402


def run_py(*args, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FUZZ / "run.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_saved_corpus_decodes_or_raises_one_line(target):
    inputs = sorted((FUZZ / "corpus" / target).iterdir())
    assert any(p.name.startswith("seed-") for p in inputs), "no seed saved"
    # a hang in compiled code is not interrupted by the per-input alarm: the process timeout is
    r = run_py(target, "--replay", "--timeout", 5, timeout=120 + 10 * len(inputs))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert f"{len(inputs)} inputs replayed, 0 findings" in r.stdout


def test_corpus_stays_small():
    files = [p for p in (FUZZ / "corpus").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 2 << 20


def test_packed_inputs_round_trip():
    files = {"meta.json": b"{}\n", "formats/sched/x/format": b"name: x @@ not a section\n",
             "cpu0.raw": bytes(range(256))}
    assert unpack(pack(files)) == files
    # names that would leave the directory are dropped
    assert unpack(b"@@ ../x\nA\n@@ /etc/x\nB\n@@ a/./b\nC\n@@ ok\nD") == {"ok": b"D"}


def test_fuzzer_runs_a_target(tmp_path):
    if importlib.util.find_spec("atheris") is None:
        host_skip("atheris is not installed (pip install -e '.[test]')")
    r = run_py("formats", "--seconds", 3, "--work", tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "findings 0" in r.stdout and "cov " in r.stdout, r.stdout
