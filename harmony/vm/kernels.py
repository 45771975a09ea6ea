"""Kernels under test: a named Debian kernel fetched into a cache, or a kernel image given by path.

A VM run (:mod:`harmony.vm.machine`) boots a :class:`Kernel`: its image (bzImage), its release and
the directory of its modules (virtme-ng puts the few it needs to boot, virtio and 9p, in the guest's
initramfs). :func:`kernel` turns what the user wrote after ``--kernel`` into one:

- a name of :data:`NAMED` (``debian:6.1``, ``debian:6.12``, and their PREEMPT_RT ``-rt`` forms):
  the newest version of the Debian package apt knows (``apt-cache search`` + ``apt-cache show``),
  fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x`` into the cache, never
  installed on the host;
- a path to a kernel image (a built bzImage, e.g. a sched_ext kernel): used as it is, its release
  read from the image's own header, its modules those of ``lib/modules/<release>`` beside it if
  any (as virtme-ng finds them);
- a name of :data:`BUILT` (``sched-ext``; ``sched-ext-full``, with what the scx project's Rust
  schedulers need): a kernel Harmony builds from source by a recipe kept as data
  (``harmony/data/<name>.json``: the Debian source package, the config options on top of
  virtme-ng's VM config, the tree's example sched_ext schedulers) with :func:`build`
  (``harmony kernel build sched-ext``). Its cache directory is named by a key, the hash of the
  recipe, the source package's version and virtme-ng's (:func:`build_key`): a machine builds a
  configuration once. A reference build (``shared/kernels/<name>`` beside the checkout or the
  install, or ``HARMONY_KERNEL_SEED``: :func:`seed_dir`) may seed the cache instead
  (:func:`seed`) when its config is the one the recipe makes of its own source version (the
  recipe records each version's sha256, checked by a build). When the distribution's source
  has moved on (a stable update), the newest build of the recipe there is -- cached or the
  reference -- is used and says so (:func:`available`); the current source is built when asked.

The cache (:data:`CACHE`, ``HARMONY_KERNEL_CACHE`` to move it) holds one directory per package
and version, ``<package>_<version>/``, laid out as the package's own tree
(``boot/vmlinuz-<release>``, ``lib/modules/<release>/`` with ``modules.dep``) plus ``kernel.json``
(what it is). A directory is unpacked under a temporary name and renamed into place once whole, so a
half-extracted kernel is never used; a lock file serialises fetches. Any other source of kernels (a
built sched_ext kernel) can add a directory of the same layout with its own ``kernel.json``.

An unknown name is a :class:`KernelError` (a :class:`~harmony.core.errors.ParameterError`: exit
status 2) naming the known ones, raised before anything starts.
"""

from __future__ import annotations

import dataclasses
import fcntl
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harmony.core.errors import KernelError, UnknownKernel  # noqa: F401  (raised here)

#: the Debian kernels Harmony knows by name: the package name's pattern (its one group is what
#: orders the versions: the ABI number of 6.1, the patch level of 6.12) and what the name means
NAMED = {
    "debian:6.1": (r"linux-image-6\.1\.0-([0-9]+)-amd64-unsigned", "Debian 12's 6.1 (CFS)"),
    "debian:6.1-rt": (r"linux-image-6\.1\.0-([0-9]+)-rt-amd64-unsigned", "6.1 PREEMPT_RT (CFS)"),
    "debian:6.12": (r"linux-image-6\.12\.([0-9]+)\+deb12-amd64-unsigned", "6.12 (EEVDF)"),
    "debian:6.12-rt": (r"linux-image-6\.12\.([0-9]+)\+deb12-rt-amd64-unsigned",
                       "6.12 PREEMPT_RT (EEVDF)"),
}
#: kernels Harmony builds from source, by name: the recipe's file in harmony/data
BUILT = {"sched-ext": "sched-ext-6.12.json",
         "sched-ext-full": "sched-ext-full-6.12.json"}
DATA = Path(__file__).parent / "data"
CACHE = Path(os.environ.get("HARMONY_KERNEL_CACHE", "/var/cache/harmony/kernels"))
#: each cached kernel's description, in its directory
RECORD = "kernel.json"
#: how long a package download may take
FETCH_TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A kernel a VM can boot.

    spec     what the user named it (``debian:6.1``, or the image's path)
    image    the kernel image (bzImage)
    release  its release (``uname -r`` in the guest), e.g. ``6.1.0-56-amd64``
    moddir   its modules' directory (``.../lib/modules/<release>``), None if it has none
    source   where it comes from: {"kind": "debian", "package", "version"} or
             {"kind": "image", "path"}
    """

    spec: str
    image: Path
    release: str
    moddir: Path | None
    source: dict

    def describe(self) -> str:
        s = self.source
        if s.get("kind") == "debian":
            return f"{self.spec} ({s['package']} {s['version']})"
        if s.get("kind") == "build":
            how = f"seeded from {s['seed']}" if s.get("from") == "seed" else "built here"
            return f"{self.spec} ({s['package']} {s['version']}, {how})"
        return f"{self.image} ({self.release})"

    def to_dict(self) -> dict:
        return {"spec": self.spec, "image": str(self.image), "release": self.release,
                "moddir": str(self.moddir) if self.moddir else None, "source": self.source}


def known_names() -> str:
    return ", ".join([*NAMED, *BUILT])


def check_spec(spec: str) -> None:
    """Raise UnknownKernel (one line, naming the known names) unless ``spec`` is a known name or
    an existing file. Nothing is fetched or read beyond that."""
    if spec in NAMED or spec in BUILT:
        return
    if Path(spec).is_file():
        return
    what = "no such kernel image" if ("/" in spec or spec.startswith(".")) else "unknown kernel"
    raise UnknownKernel(f"{what} {spec!r}: give one of {known_names()} or the path of a "
                        "kernel image (bzImage)")


def kernel(spec: str, cache: Path | None = None, progress=None) -> Kernel:
    """The kernel ``spec`` names, fetched into the cache if it is a name not cached yet.
    ``progress(line)`` is told what is being fetched."""
    check_spec(spec)
    if spec in NAMED:
        return fetch(spec, cache, progress)
    if spec in BUILT:
        return available(spec, cache, progress)
    return from_image(Path(spec), spec)


# --- a kernel image given by path ---------------------------------------------------------------

def image_release(image: Path) -> str:
    """The release of a bzImage, read from its setup header (``kernel_version``); KernelError if
    the file is not an x86 kernel image."""
    try:
        with open(image, "rb") as f:
            head = f.read(65536)
    except OSError as exc:
        raise KernelError(f"{image}: cannot read the kernel image ({exc.strerror})") from None
    if len(head) < 0x210 or head[0x202:0x206] != b"HdrS":
        raise KernelError(f"{image}: not a bzImage (no Linux boot header)")
    offset = struct.unpack_from("<H", head, 0x20E)[0] + 0x200
    text = head[offset:offset + 256].split(b"\0", 1)[0].decode(errors="replace")
    if not text.strip():
        raise KernelError(f"{image}: the boot header names no kernel version")
    return text.split()[0]


def from_image(image: Path, spec: str | None = None) -> Kernel:
    """A kernel image given by path; its modules are ``lib/modules/<release>`` in the first
    directory above the image that has one (the layout of an unpacked package or a build's
    ``make modules_install INSTALL_MOD_PATH=``), else none."""
    image = Path(image).absolute()
    release = image_release(image)
    moddir = None
    for root in image.parents:
        candidate = root / "lib" / "modules" / release
        if candidate.is_dir():
            moddir = candidate
            break
    return Kernel(spec or str(image), image, release, moddir, {"kind": "image", "path": str(image)})


# --- named Debian kernels -----------------------------------------------------------------------

def _run(argv: list[str], timeout: float = 60, cwd: Path | None = None) -> str:
    """Run a packaging command; its output, or KernelError with its last line of error."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except FileNotFoundError:
        raise KernelError(f"{argv[0]} is not installed "
                          f"(install.sh installs what VMs need)") from None
    except subprocess.TimeoutExpired:
        raise KernelError(f"{' '.join(argv[:3])} took over {timeout:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise KernelError(f"{' '.join(argv[:3])} failed (exit {done.returncode}): {last}")
    return done.stdout


def resolve(name: str) -> tuple[str, str]:
    """(package, version) of the newest Debian package apt knows for the kernel ``name``."""
    pattern, _ = NAMED[name]
    out = _run(["apt-cache", "search", "--names-only", f"^{pattern}$"])
    found = []
    for line in out.splitlines():
        package = line.split(" - ", 1)[0].strip()
        m = re.fullmatch(pattern, package)
        if m:
            found.append((int(m.group(1)), package))
    if not found:
        raise KernelError(f"kernel {name}: apt knows no package matching {pattern} "
                          "(run apt-get update, or check the Debian sources)")
    package = max(found)[1]
    show = _run(["apt-cache", "show", "--no-all-versions", package])
    m = re.search(r"^Version:\s*(\S+)", show, re.M)
    if not m:
        raise KernelError(f"kernel {name}: apt-cache show {package} gives no version")
    return package, m.group(1)


def cache_dir(cache: Path | None = None) -> Path:
    return Path(cache) if cache is not None else CACHE


def cached(cache: Path | None = None) -> list[Kernel]:
    """Every whole kernel in the cache (those with a record), by directory name."""
    out = []
    root = cache_dir(cache)
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if d.name.startswith(".") or not (d / RECORD).is_file():
            continue
        try:
            out.append(_load(d))
        except KernelError:
            continue
    return out


def _load(d: Path) -> Kernel:
    try:
        rec = json.loads((d / RECORD).read_text())
        return Kernel(rec["spec"], d / rec["image"], rec["release"],
                      d / rec["moddir"] if rec.get("moddir") else None, rec["source"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KernelError(f"{d / RECORD}: not a kernel record ({exc})") from None


def fetch(name: str, cache: Path | None = None, progress=None) -> Kernel:
    """The Debian kernel ``name`` in the cache, fetched and unpacked first if it is not there.

    Where apt cannot resolve the name (no package lists, no network) and the cache holds a kernel
    of that name already, the newest cached one is used."""
    root = cache_dir(cache)
    say = progress or (lambda line: None)
    try:
        package, version = resolve(name)
    except KernelError:
        have = [k for k in cached(root) if k.spec == name]
        if have:
            return have[-1]
        raise
    final = root / f"{package}_{version}"
    if (final / RECORD).is_file():
        return _load(final)
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise KernelError(f"cannot use the kernel cache {root} ({exc.strerror})") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)      # another fetch of the same cache waits here
        if (final / RECORD).is_file():        # it fetched this one meanwhile
            return _load(final)
        say(f"fetching {package} {version} into {root}")
        reclaim_partial(root)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".partial-{os.getpid()}-"))
        try:
            kernel = _unpack(name, package, version, tmp)
            if final.exists():                # a broken directory without a record
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dataclasses.replace(kernel, image=final / kernel.image.relative_to(tmp),
                                   moddir=final / kernel.moddir.relative_to(tmp)
                                   if kernel.moddir else None)
    finally:
        os.close(lock)


def reclaim_partial(root: Path) -> None:
    """Remove what a fetch killed half-way left (``.partial-<pid>-*`` of a process gone)."""
    for d in root.glob(".partial-*"):
        try:
            pid = int(d.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if pid == os.getpid() or not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


def _unpack(name: str, package: str, version: str, into: Path) -> Kernel:
    """Download ``package`` at ``version`` and unpack it into ``into`` with its record."""
    download = into / ".download"
    download.mkdir()
    # apt's sandbox user cannot write here: it says so and downloads as root, which is what we want
    _run(["apt-get", "download", "-q", f"{package}={version}"], FETCH_TIMEOUT_S, cwd=download)
    debs = list(download.glob("*.deb"))
    if len(debs) != 1:
        raise KernelError(f"apt-get download {package}: expected one .deb, found {len(debs)}")
    _run(["dpkg-deb", "-x", str(debs[0]), str(into)], FETCH_TIMEOUT_S)
    shutil.rmtree(download)
    images = sorted((into / "boot").glob("vmlinuz-*"))
    if len(images) != 1:
        raise KernelError(f"{package} {version}: expected one boot/vmlinuz-*, found {len(images)}")
    release = images[0].name.removeprefix("vmlinuz-")
    moddir = into / "lib" / "modules" / release
    if moddir.is_dir():
        # the package ships no modules.dep (its postinst makes it): made here, once, so that
        # nothing writes into the cache later
        _run(["depmod", "-a", "-b", str(into), release], 300)
    else:
        moddir = None
    kernel = Kernel(name, images[0], release, moddir,
                    {"kind": "debian", "package": package, "version": version})
    (into / RECORD).write_text(json.dumps({
        "spec": name, "image": str(images[0].relative_to(into)), "release": release,
        "moddir": str(moddir.relative_to(into)) if moddir else None, "source": kernel.source,
    }, indent=1) + "\n")
    return kernel


# --- kernels built from source ------------------------------------------------------------------

#: how often a build says where it is (seconds), and how long one step may take
BUILD_SAY_EVERY_S = 30.0
BUILD_STEP_TIMEOUT_S = 4 * 3600


def recipe(name: str) -> dict:
    """The recipe of the built kernel ``name`` (harmony/data/<file>.json)."""
    return json.loads((DATA / BUILT[name]).read_text())


def vng_version() -> str:
    from importlib import metadata      # here: 0.6 s of the VM agent's start (TCG, 9p)

    try:
        return metadata.version("virtme-ng")
    except metadata.PackageNotFoundError:
        return "none"


def build_key(rec: dict, version: str, vng: str | None = None) -> str:
    """The cache key of a build: what determines its result (the recipe, the source package's
    version, virtme-ng's version, whose VM config is the base)."""
    what = {"recipe": {k: v for k, v in rec.items() if not k.startswith("config_sha256")},
            "source_version": version, "virtme_ng": vng or vng_version()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def source_version(rec: dict) -> str:
    """The version of the recipe's source package: the installed one, else the one apt would
    install (KernelError if apt knows none)."""
    package = rec["source_package"]
    try:
        done = subprocess.run(["dpkg-query", "-W", "-f=${Status}\\t${Version}", package],
                              capture_output=True, text=True, timeout=60)
        status, _, version = done.stdout.partition("\t")
        if done.returncode == 0 and status.endswith(" installed") and version:
            return version
    except (OSError, subprocess.TimeoutExpired):
        pass
    show = _run(["apt-cache", "show", "--no-all-versions", package])
    m = re.search(r"^Version:\s*(\S+)", show, re.M)
    if not m:
        raise KernelError(f"apt knows no package {package} (run apt-get update)")
    return m.group(1)


def upstream_release(version: str) -> str:
    """The kernel release a Debian source version builds: ``6.12.117-1~deb12u1`` -> ``6.12.117``."""
    return version.split("-", 1)[0]


def built_dir(name: str, key: str, cache: Path | None = None) -> Path:
    return cache_dir(cache) / f"{name}_{key}"


#: where reference builds are looked for, beside a checkout or an install: the first
#: ``<ancestor>/shared/kernels/<recipe>`` of the package's directory, then of the current one
SEED_SUBDIR = Path("shared") / "kernels"


def seed_dir(name: str) -> Path:
    """Where a reference build of ``name`` may be (a directory holding bzImage, config.gz and the
    recipe's schedulers, named as the recipe's file: ``sched-ext-6.12``).

    ``HARMONY_KERNEL_SEED``, if set: that directory, or the directory of the kernels holding it.
    Else the first ``shared/kernels/<name>`` found beside an ancestor of Harmony's own directory
    (a clone, a worktree, a venv inside either) or, failing that, of the current directory (an
    install used from the clone's root); if none exists, the one beside the directory holding
    Harmony's package, a clone's ``../shared/kernels/<name>`` (named in messages)."""
    sub = Path(BUILT[name]).stem
    env = os.environ.get("HARMONY_KERNEL_SEED")
    if env:
        base = Path(env)
        return base if (base / "config.gz").exists() else base / sub
    here = Path(__file__).resolve().parent
    candidates = [a / SEED_SUBDIR / sub for start in (here, Path.cwd().resolve())
                  for a in start.parents]
    # none: named beside the clone (it named one inside the package, harmony/shared/...)
    beside = here.parents[min(2, len(here.parents) - 1)] / SEED_SUBDIR / sub
    return next((c for c in candidates if c.is_dir()), beside)


def seed_matches(rec: dict, seed: Path, version: str) -> tuple[bool, str]:
    """Whether the reference build in ``seed`` is what :func:`build` makes of ``rec`` for the
    source ``version``: its config.gz is the config the recipe records for that version, its
    image is of that release, and it has every scheduler. (matches, why not)."""
    want = rec.get("config_sha256", {}).get(version)
    if want is None:
        return False, f"the recipe records no config for {rec['source_package']} {version}"
    try:
        config = gzip.decompress((seed / "config.gz").read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        return False, f"{seed / 'config.gz'}: {getattr(exc, 'strerror', None) or exc}"
    if hashlib.sha256(config).hexdigest() != want:
        return False, f"{seed / 'config.gz'} is not the config the recipe makes of {version}"
    try:
        release = image_release(seed / "bzImage")
    except KernelError as exc:
        return False, str(exc)
    if release != upstream_release(version):
        return False, f"{seed / 'bzImage'} is release {release}, not {upstream_release(version)}"
    missing = [s for s in rec["schedulers"] if not (seed / s).is_file()]
    if missing:
        return False, f"{seed} lacks {', '.join(missing)}"
    return True, ""


def kernel_config_text(kernel) -> str | None:
    """The configuration of ``kernel``: a Debian package's ``boot/config-RELEASE`` beside its
    image, or a build's ``config.gz``; None where neither is found."""
    d = Path(kernel.image).parent
    for path in (d / f"config-{kernel.release}", d / "config.gz"):
        try:
            data = path.read_bytes()
            return (gzip.decompress(data) if path.suffix == ".gz" else data).decode(
                errors="replace")
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
    return None


def built_config(name: str, cache: Path | None = None) -> str | None:
    """The .config of the built kernel ``name`` (its ``config.gz``), None if it is not built or
    its config cannot be read."""
    try:
        return kernel_config_text(kernel(name, cache))
    except KernelError:
        return None


def _record_build(d: Path, name: str, rec: dict, version: str, key: str, how: dict) -> Kernel:
    """Write the record of a built kernel laid out in ``d`` (bzImage, config.gz, schedulers)."""
    release = image_release(d / "bzImage")
    source = {"kind": "build", "recipe": name, "package": rec["source_package"],
              "version": version, "key": key, "virtme_ng": vng_version(),
              "schedulers": list(rec["schedulers"]), **how}
    (d / RECORD).write_text(json.dumps({"spec": name, "image": "bzImage", "release": release,
                                        "moddir": None, "source": source}, indent=1) + "\n")
    return Kernel(name, d / "bzImage", release, None, source)


def cache_lock(root: Path, say=None):
    """An exclusive lock of the cache ``root`` (a file descriptor: os.close releases it); where
    another build or seeding holds it (a build: up to half an hour), ``say(line)`` is told why
    this one waits before it does (without ``say``: on standard error, a wait not to be silent)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise KernelError(f"cannot use the kernel cache {root} ({exc.strerror})") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        line = f"waiting for the kernel cache {root}: another build or seeding holds it"
        if say is not None:
            say(line)
        else:
            print(f"harmony: {line}", file=sys.stderr, flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)     # another fetch or build of the same cache waits here
    return lock


def discard_failed(tmp: Path, log: Path) -> Path | None:
    """Remove the temporary directory of a failed build, its ``build.log`` kept as ``log``
    (returned; None if it could not be kept)."""
    try:
        shutil.copy2(tmp / "build.log", log)
    except OSError:
        log = None
    shutil.rmtree(tmp, ignore_errors=True)
    return log


def place_dir(tmp: Path, final: Path) -> None:
    """Rename a whole directory into place (over a directory without a record)."""
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)


def seed(name: str, cache: Path | None = None, version: str | None = None,
         source: Path | None = None, progress=None) -> Kernel:
    """Copy the reference build of ``name`` into the cache under the key of ``version`` (default:
    the source package's); KernelError saying why if it does not match the recipe."""
    rec = recipe(name)
    version = version or source_version(rec)
    src = Path(source) if source is not None else seed_dir(name)
    ok, why = seed_matches(rec, src, version)
    if not ok:
        raise KernelError(f"kernel {name}: the reference build cannot seed the cache: {why}")
    key = build_key(rec, version)
    root = cache_dir(cache)
    final = built_dir(name, key, root)
    lock = cache_lock(root, progress)
    try:
        if (final / RECORD).is_file():
            return _load(final)
        reclaim_partial(root)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".partial-{os.getpid()}-"))
        try:
            for f in ["bzImage", "config.gz", *rec["schedulers"]]:
                shutil.copy2(src / f, tmp / f)
            _record_build(tmp, name, rec, version, key, {"from": "seed", "seed": str(src)})
            place_dir(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return _load(final)
    finally:
        os.close(lock)


def seed_version(rec: dict, seed: Path) -> tuple[str | None, str]:
    """The source version whose build the reference build in ``seed`` is (the version of the
    recipe's ``config_sha256`` it matches: :func:`seed_matches`), or None and why not."""
    if not seed.is_dir():
        return None, (f"none in {SEED_SUBDIR / seed.name} above Harmony's directory or the "
                      "current one (HARMONY_KERNEL_SEED names one elsewhere)")
    whys = []
    for version in sorted(rec.get("config_sha256", {}), key=version_order, reverse=True):
        ok, why = seed_matches(rec, seed, version)
        if ok:
            return version, ""
        whys.append(why)
    return None, whys[0] if whys else "the recipe records no config of any version"


def version_order(version: str) -> tuple:
    """A sort key of Debian versions that orders them as dpkg does (``[epoch:]upstream[-revision]``,
    each compared by its runs of non-digits, ``~`` before anything, even the end, and digits)."""
    epoch, _, rest = version.rpartition(":")
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")

    def part(text: str, runs: int = 16) -> tuple:
        pairs = []
        for alpha, num in re.findall(r"(\D*)(\d*)", text)[:runs]:
            weights = tuple(-1 if c == "~" else ord(c) if c.isalpha() else ord(c) + 256
                            for c in alpha)
            pairs.append((weights + (0,), int(num or 0)))
        return tuple(pairs + [((0,), 0)] * (runs - len(pairs)))

    return (int(epoch or 0), part(upstream), part(revision))


def builds(name: str, cache: Path | None = None) -> list[Kernel]:
    """The builds of the recipe ``name`` in the cache, newest source version first: those made
    (or seeded) by this recipe as it is (their key is what the recipe, their version and the
    virtme-ng they had make); a build of an older recipe is not one."""
    rec = recipe(name)
    out = [k for k in cached(cache) if k.spec == name and k.source.get("kind") == "build"
           and k.source.get("key") == build_key(rec, k.source.get("version", "?"),
                                                k.source.get("virtme_ng"))]
    return sorted(out, key=lambda k: (version_order(k.source["version"]),
                                      k.source.get("virtme_ng") == vng_version()), reverse=True)


def available(name: str, cache: Path | None = None, progress=None) -> Kernel:
    """The built kernel ``name``: the build of the source package's current version if it is
    cached (or the reference build is of that version: it seeds the cache); else the newest build
    of the recipe there is, cached or the reference build (whose config is what the recipe makes
    of its own version), with a note saying which version it is and the command that builds the
    current one (``source["note"]``, ``source["current_version"]``: a distribution's stable
    update does not make a build unusable, nor a recipe need editing); else KernelError saying
    that command. Where the source package's version cannot be known (no apt lists), the newest
    build there is is used."""
    say = progress or (lambda line: None)
    rec = recipe(name)
    try:
        version = source_version(rec)
    except KernelError:
        version = None
    if version is not None:
        final = built_dir(name, build_key(rec, version), cache)
        if (final / RECORD).is_file():
            return _load(final)
    have = builds(name, cache)
    seeded, why_not = seed_version(rec, seed_dir(name))
    newest = have[0].source["version"] if have else None
    if seeded is not None and (newest is None or version_order(seeded) > version_order(newest)):
        say(f"seeding the kernel cache with the reference build {seed_dir(name)} ({seeded})")
        have.insert(0, seed(name, cache, seeded, progress=progress))
    if not have:
        if version is None:
            raise KernelError(f"kernel {name} is not built, and apt knows no "
                              f"{rec['source_package']} to build it from (run apt-get update)")
        raise KernelError(f"kernel {name} is not built ({rec['source_package']} {version}; no "
                          f"reference build: {why_not}): `harmony kernel build {name}` builds it "
                          "(12-28 min on 2 CPUs)")
    k = have[0]
    if version is None or k.source["version"] == version:
        return k
    how = f"seeded from {k.source['seed']}" if k.source.get("from") == "seed" else "built here"
    note = (f"kernel {name}: using its build of {rec['source_package']} {k.source['version']} "
            f"({how}); the source is now {version}: `harmony kernel build {name}` builds that")
    return dataclasses.replace(k, source={**k.source, "current_version": version, "note": note})


def status(name: str, cache: Path | None = None) -> str:
    """One line for ``harmony kernel list``: the build ``--kernel name`` uses (how it came, its
    version, and whether the source has moved on), or not built and the command."""
    rec = recipe(name)
    try:
        version = source_version(rec)
    except KernelError as exc:
        version, why = None, str(exc)
    have = builds(name, cache)
    seeded, _ = seed_version(rec, seed_dir(name))
    if have and (seeded is None or version_order(have[0].source["version"])
                 >= version_order(seeded)):
        s = have[0].source
        used = s["version"]
        how = (f"seeded from {s['seed']}" if s.get("from") == "seed" else
               "built here" + (f" in {s['build_s'] / 60:.0f} min" if s.get("build_s") else ""))
        line = f"{how} ({rec['source_package']} {used}), {have[0].image.parent}"
    elif seeded is not None:
        used = seeded
        line = (f"the reference build {seed_dir(name)} ({rec['source_package']} {used}) seeds "
                "the cache when first used")
    else:
        return (f"not built ({rec['source_package']} {version or '?'}"
                f"{'' if version else ': ' + why}): `harmony kernel build {name}` builds it "
                "(12-28 min on 2 CPUs)")
    if version is not None and used != version:
        line += f"; the source is now {version}: `harmony kernel build {name}` builds that"
    return line


def missing_packages(packages: list[str]) -> list[str]:
    """Those of ``packages`` dpkg does not have installed."""
    out = []
    for p in packages:
        done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                              text=True)
        if done.returncode != 0 or not done.stdout.endswith(" installed"):
            out.append(p)
    return out


def install_packages(packages: list[str], what: str, say) -> None:
    """Install those of the Debian ``packages`` that are missing (as root; KernelError saying
    which ``what`` needs otherwise)."""
    missing = missing_packages(packages)
    if missing:
        if os.geteuid() != 0:
            raise KernelError(f"{what} needs these Debian packages: {' '.join(missing)} "
                              "(run as root to install them)")
        say(f"installing the Debian packages {what} needs: {' '.join(missing)}")
        _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], 1800)


def build_step(argv: list[str], cwd: Path, log, say, label: str,
               env: dict | None = None) -> None:
    """Run one build step, its output to ``log``; every BUILD_SAY_EVERY_S a line saying how long
    it has run and its last line of output. KernelError with its last lines if it fails."""
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    t0 = time.monotonic()
    said = t0
    tail: list[str] = []
    try:
        # a session of its own: on any error, Ctrl-C or SIGTERM the whole step (make and the
        # compilers it runs) is killed below, not make alone
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, errors="replace",
                                env={**os.environ, **(env or {})}, start_new_session=True)
    except OSError as exc:
        raise KernelError(f"{label}: {argv[0]} could not start ({exc.strerror})") from None
    try:
        for line in proc.stdout:
            log.write(line)
            tail = (tail + [line.rstrip()])[-5:]
            now = time.monotonic()
            if now - said >= BUILD_SAY_EVERY_S:
                said = now
                say(f"  {label}: {now - t0:4.0f} s, {tail[-1].strip()[:100]}")
            if now - t0 > BUILD_STEP_TIMEOUT_S:
                raise KernelError(f"{label} took over {BUILD_STEP_TIMEOUT_S / 3600:.0f} h")
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    log.flush()
    if rc != 0:
        last = " | ".join(t.strip() for t in tail[-3:] if t.strip())
        raise KernelError(f"{label} failed (exit {rc}): {last}"[:600])


def build(name: str, cache: Path | None = None, progress=None, jobs: int | None = None,
          rebuild: bool = False) -> Kernel:
    """Build the kernel ``name`` from source by its recipe into the cache (once per
    configuration: a cached *build* is returned as it is unless ``rebuild``; a seeded copy is
    replaced by a build). Installs the Debian packages it needs when missing (root). Steps, each
    said through ``progress(line)``: packages, unpack the source, configure (virtme-ng's VM
    config + the recipe's options, each checked in the result), ``make bzImage``, the example
    schedulers (``make LLVM=-19`` in tools/sched_ext), then the directory is renamed into place.
    The build tree (a few GB) is removed after; the log is kept as ``build.log``."""
    say = progress or (lambda line: None)
    rec = recipe(name)
    root = cache_dir(cache)
    jobs = jobs or len(os.sched_getaffinity(0))
    install_packages(rec["packages"], f"building {name}", say)
    configkernel = shutil.which("virtme-configkernel")
    if configkernel is None:
        raise KernelError("virtme-configkernel (virtme-ng) is not installed "
                          "(install.sh installs it)")
    version = source_version(rec)
    key = build_key(rec, version)
    final = built_dir(name, key, root)
    if (final / RECORD).is_file() and not rebuild and _load(final).source.get("from") == "build":
        say(f"{name} is built already: {final}")
        return _load(final)
    lock = cache_lock(root, say)
    try:
        reclaim_partial(root)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".partial-{os.getpid()}-"))
        t_start = time.monotonic()
        try:
            with open(tmp / "build.log", "w") as log:
                tree = tmp / "src"
                tree.mkdir()
                say(f"[1/4] unpacking {rec['tarball']} ({rec['source_package']} {version})")
                build_step(["tar", "-xf", rec["tarball"], "-C", str(tree), "--strip-components=1"],
                      tmp, log, say, "unpack")
                say("[2/4] configuring: virtme-ng's VM config + "
                    f"{len(rec['configitems'])} options")
                build_step([configkernel, "--defconfig",
                       *[a for item in rec["configitems"] for a in ("--configitem", item)]],
                      tree, log, say, "configure")
                config = (tree / ".config").read_bytes()
                _check_config(config.decode(errors="replace"), rec["configitems"])
                t_kernel = time.monotonic()
                say(f"[3/4] make -j{jobs} {rec['kernel_target']} (12-28 min on 2 CPUs)")
                build_step(["make", f"-j{jobs}", rec["kernel_target"]], tree, log, say, "make")
                kernel_s = time.monotonic() - t_kernel
                t_scx = time.monotonic()
                say(f"[4/4] the example schedulers: make {' '.join(rec['schedulers_make'])} "
                    f"in {rec['schedulers_dir']}")
                build_step(["make", f"-j{jobs}", *rec["schedulers_make"]],
                      tree / rec["schedulers_dir"], log, say, "schedulers")
                scx_s = time.monotonic() - t_scx
            shutil.copy2(tree / "arch/x86/boot/bzImage", tmp / "bzImage")
            (tmp / "config.gz").write_bytes(gzip.compress(config, mtime=0))
            for s in rec["schedulers"]:
                built_bin = tree / rec["schedulers_dir"] / "build" / "bin" / s
                shutil.copy2(built_bin, tmp / s)
                _run(["strip", str(tmp / s)])
            shutil.rmtree(tree)
            config_sha = hashlib.sha256(config).hexdigest()
            known = rec.get("config_sha256", {}).get(version)
            _record_build(tmp, name, rec, version, key, {
                "from": "build", "build_s": round(time.monotonic() - t_start, 1),
                "kernel_s": round(kernel_s, 1), "schedulers_s": round(scx_s, 1), "jobs": jobs,
                "config_sha256": config_sha,
                "config_as_recorded": None if known is None else known == config_sha})
            place_dir(tmp, final)
        except BaseException as exc:
            kept = discard_failed(tmp, root / f"{name}-build-failed.log")
            if isinstance(exc, KernelError) and kept is not None:
                raise KernelError(f"{exc} (log: {kept})") from None
            raise
        return _load(final)
    finally:
        os.close(lock)


def _check_config(config: str, items: list[str]) -> None:
    """KernelError naming the first option of the recipe the configured tree does not have as
    asked (a dependency Kconfig did not satisfy)."""
    have = set(config.splitlines())
    for item in items:
        key, _, value = item.partition("=")
        if item not in have and not (value == "n" and f"# {key} is not set" in have):
            raise KernelError(f"the configured tree does not have {item} (a dependency missing?)")
