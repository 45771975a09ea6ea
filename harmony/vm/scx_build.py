"""The scx project's Rust sched_ext schedulers, built here from their crates.

``harmony scx build [NAME...]`` builds ``scx_bpfland``, ``scx_rusty`` and ``scx_lavd`` (the
recipe is data: ``harmony/data/scx-rust.json``: the crates, their version, the environment and
the Debian packages their build needs) with ``cargo install --locked`` from crates.io, into a
cache (:data:`CACHE`, ``HARMONY_SCX_CACHE`` to move it) of one directory per scheduler, named by
a key (:func:`build_key`: the recipe and the Rust compiler's version): a machine builds a
configuration once. The crates' dependencies are compiled once for all three (one cargo target
directory in the cache, removed after the build: 1.7 GB here). A directory is built under a
temporary name and renamed into place once whole, with ``build.json`` saying how and how long;
a failed build keeps its log beside.

:func:`built` finds a built scheduler for ``--scx NAME`` (:func:`harmony.vm.scx.resolve`).
Errors are :class:`~harmony.core.errors.ScxError`: a missing cargo or an old Rust, a failed build
with its last lines, an unknown name (:class:`~harmony.core.errors.UnknownScheduler`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from harmony.core.errors import KernelError, ScxError, UnknownScheduler
from harmony.vm.kernels import CACHE as KERNEL_CACHE
from harmony.vm.kernels import (
    build_step,
    cache_lock,
    discard_failed,
    install_packages,
    place_dir,
    reclaim_partial,
)

RECIPE = Path(__file__).parent / "data" / "scx-rust.json"
CACHE = Path(os.environ.get("HARMONY_SCX_CACHE", KERNEL_CACHE.parent / "scx"))
RECORD = "build.json"


@functools.cache
def recipe() -> dict:
    """The recipe (read once; never modified)."""
    return json.loads(RECIPE.read_text())


def names() -> list[str]:
    """The Rust schedulers Harmony knows by name (``rusty``, ...)."""
    return list(recipe()["crates"])


def cargo() -> str | None:
    """cargo's path: on PATH, else rustup's default place."""
    found = shutil.which("cargo")
    home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")) / "bin" / "cargo"
    return found or (str(home) if os.access(home, os.X_OK) else None)


def rustc_version(cargo_path: str) -> str:
    """``rustc --version``'s version of the toolchain beside ``cargo_path`` ("" if none)."""
    rustc = Path(cargo_path).with_name("rustc")
    try:
        out = subprocess.run([str(rustc) if rustc.exists() else "rustc", "--version"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    parts = out.split()
    return parts[1] if len(parts) > 1 else ""


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("-")[0].split(".") if x.isdigit())


def build_key(rec: dict, rustc: str) -> str:
    """What determines a build's result: the recipe and the Rust compiler's version."""
    what = {"recipe": {k: v for k, v in rec.items() if not k.endswith("_why")}, "rustc": rustc}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _dir(name: str, key: str, cache: Path | None) -> Path:
    return Path(cache or CACHE) / f"{recipe()['crates'][name]}-{recipe()['version']}_{key}"


def _check_name(name: str) -> str:
    short = name.removeprefix("scx_")
    if short not in recipe()["crates"]:
        raise UnknownScheduler(f"unknown Rust scheduler {name!r}: give one of "
                               f"{', '.join(names())}")
    return short


def built(name: str, cache: Path | None = None) -> Path | None:
    """The built binary of the Rust scheduler ``name`` for this machine's toolchain (or, where
    no cargo is left to ask, the newest built one), None if it is not built."""
    short = _check_name(name)
    rec = recipe()
    path = cargo()
    rustc = rustc_version(path) if path else ""
    if rustc:
        d = _dir(short, build_key(rec, rustc), cache)
        return d / rec["crates"][short] if (d / RECORD).is_file() else None
    have = sorted(Path(cache or CACHE).glob(f"{rec['crates'][short]}-{rec['version']}_*/"
                                            f"{RECORD}"), key=lambda p: p.stat().st_mtime)
    return have[-1].parent / rec["crates"][short] if have else None


def kernel_lacks(config: str) -> list[str]:
    """What the Rust schedulers need of a kernel (the recipe's ``kernel_needs``) that its
    ``config`` (a .config's text) does not set."""
    have = set(config.splitlines())
    return [need for need in recipe()["kernel_needs"] if need not in have]


def recipe_lacks(configitems: list[str]) -> list[str]:
    """What the Rust schedulers need of a kernel that the kernel's recipe (its ``configitems``,
    ``CONFIG_X=n`` for "not set") sets otherwise: known before the kernel is built, so a user is
    not sent to build a scheduler the kernel cannot run (what the base config decides is not
    known until then)."""
    set_to = dict(item.split("=", 1) for item in configitems)
    needs = [need.split("=", 1) for need in recipe()["kernel_needs"]]
    return [f"{option}={value}" for option, value in needs
            if option in set_to and set_to[option] != value]


def status(name: str, cache: Path | None = None) -> str:
    """One line for ``harmony scx list``."""
    path = built(name, cache)
    if path is None:
        return f"not built: `harmony scx build {name}` builds it (1-3 min on 2 CPUs)"
    how = json.loads((path.parent / RECORD).read_text())
    return f"built here in {how['build_s'] / 60:.1f} min (rustc {how['rustc']}), {path}"


def build(which: list[str], cache: Path | None = None, progress=None, jobs: int | None = None,
          rebuild: bool = False) -> dict[str, Path]:
    """Build the Rust schedulers ``which`` (short names) by the recipe; {name: binary}. A built
    one is returned as it is unless ``rebuild``. Installs the Debian packages the build needs
    when missing (root)."""
    say = progress or (lambda line: None)
    rec = recipe()
    which = [_check_name(n) for n in which]
    path = cargo()
    if path is None:
        raise ScxError("building the Rust schedulers needs cargo (Rust >= "
                       f"{rec['rust_min']}; https://rustup.rs), which is not installed")
    rustc = rustc_version(path)
    if _version_tuple(rustc) < _version_tuple(rec["rust_min"]):
        raise ScxError(f"the Rust schedulers {rec['version']} need Rust >= {rec['rust_min']}; "
                       f"this machine has {rustc or 'none'} (rustup update)")
    try:
        install_packages(rec["packages"], "building the Rust schedulers", say)
    except KernelError as exc:
        raise ScxError(str(exc)) from None
    key = build_key(rec, rustc)
    root = Path(cache or CACHE)
    jobs = jobs or len(os.sched_getaffinity(0))
    out = {}
    lock = _lock(root)
    try:
        reclaim_partial(root)
        for i, name in enumerate(which, 1):
            crate = rec["crates"][name]
            final = _dir(name, key, root)
            if (final / RECORD).is_file() and not rebuild:
                say(f"[{i}/{len(which)}] {crate} {rec['version']} is built already: {final}")
                out[name] = final / crate
                continue
            say(f"[{i}/{len(which)}] cargo install {crate}@{rec['version']} (rustc {rustc})")
            out[name] = _build_one(path, crate, rec, rustc, key, final, jobs, say) / crate
    finally:
        shutil.rmtree(root / ".target", ignore_errors=True)     # 1.7 GB for the three here
        os.close(lock)
    return out


def _lock(root: Path) -> int:
    try:
        return cache_lock(root)
    except KernelError as exc:
        raise ScxError(str(exc).replace("kernel cache", "scheduler cache")) from None


def _build_one(cargo_path: str, crate: str, rec: dict, rustc: str, key: str, final: Path,
               jobs: int, say) -> Path:
    """cargo install ``crate`` into a temporary directory, recorded, then renamed to ``final``."""
    root = final.parent
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".partial-{os.getpid()}-"))
    t0 = time.monotonic()
    env = {**rec["env"], "CARGO_TARGET_DIR": str(root / ".target")}
    try:
        with open(tmp / "build.log", "w") as log:
            build_step([cargo_path, "install", "--locked", "--jobs", str(jobs), "--root",
                        str(tmp / "root"), "--version", rec["version"], crate],
                       tmp, log, say, crate, env=env)
        shutil.move(tmp / "root" / "bin" / crate, tmp / crate)
        shutil.rmtree(tmp / "root")
        (tmp / RECORD).write_text(json.dumps({
            "crate": crate, "version": rec["version"], "rustc": rustc, "key": key,
            "env": rec["env"], "build_s": round(time.monotonic() - t0, 1)}, indent=1) + "\n")
        place_dir(tmp, final)
    except BaseException as exc:
        kept = discard_failed(tmp, root / f"{crate}-build-failed.log")
        if isinstance(exc, KernelError):
            raise ScxError(f"{exc}" + (f" (log: {kept})" if kept else "")) from None
        raise
    return final

