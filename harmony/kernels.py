"""Kernels under test: a named Debian kernel fetched into a cache, or a kernel image given by path.

A VM run (:mod:`harmony.vm`) boots a :class:`Kernel`: its image (bzImage), its release and the
directory of its modules (virtme-ng puts the few it needs to boot, virtio and 9p, in the guest's
initramfs). :func:`kernel` turns what the user wrote after ``--kernel`` into one:

- a name of :data:`NAMED` (``debian:6.1``, ``debian:6.12``, and their PREEMPT_RT ``-rt`` forms):
  the newest version of the Debian package apt knows (``apt-cache search`` + ``apt-cache show``),
  fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x`` into the cache, never
  installed on the host;
- a path to a kernel image (a built bzImage, e.g. a sched_ext kernel): used as it is, its release
  read from the image's own header, its modules those of ``lib/modules/<release>`` beside it if
  any (as virtme-ng finds them).

The cache (:data:`CACHE`, ``HARMONY_KERNEL_CACHE`` to move it) holds one directory per package
and version, ``<package>_<version>/``, laid out as the package's own tree (``boot/vmlinuz-<release>``,
``lib/modules/<release>/`` with ``modules.dep``) plus ``kernel.json`` (what it is). A directory is
unpacked under a temporary name and renamed into place once whole, so a half-extracted kernel is
never used; a lock file serialises fetches. Any other source of kernels (a built sched_ext kernel)
can add a directory of the same layout with its own ``kernel.json``.

An unknown name is a :class:`KernelError` (a :class:`~harmony.errors.ParameterError`: exit status
2) naming the known ones, raised before anything starts.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

from harmony.errors import KernelError, UnknownKernel  # noqa: F401  (raised here)

#: the Debian kernels Harmony knows by name: the package name's pattern (its one group is what
#: orders the versions: the ABI number of 6.1, the patch level of 6.12) and what the name means
NAMED = {
    "debian:6.1": (r"linux-image-6\.1\.0-([0-9]+)-amd64-unsigned", "Debian 12's 6.1 (CFS)"),
    "debian:6.1-rt": (r"linux-image-6\.1\.0-([0-9]+)-rt-amd64-unsigned", "6.1 PREEMPT_RT (CFS)"),
    "debian:6.12": (r"linux-image-6\.12\.([0-9]+)\+deb12-amd64-unsigned", "6.12 (EEVDF)"),
    "debian:6.12-rt": (r"linux-image-6\.12\.([0-9]+)\+deb12-rt-amd64-unsigned",
                       "6.12 PREEMPT_RT (EEVDF)"),
}
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
        return f"{self.image} ({self.release})"

    def to_dict(self) -> dict:
        return {"spec": self.spec, "image": str(self.image), "release": self.release,
                "moddir": str(self.moddir) if self.moddir else None, "source": self.source}


def known_names() -> str:
    return ", ".join(NAMED)


def check_spec(spec: str) -> None:
    """Raise UnknownKernel (one line, naming the known names) unless ``spec`` is a known name or
    an existing file. Nothing is fetched or read beyond that."""
    if spec in NAMED:
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
        raise KernelError(f"{argv[0]} is not installed (install.sh installs what VMs need)") from None
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
        _reclaim_partial(root)
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


def _reclaim_partial(root: Path) -> None:
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
