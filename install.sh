#!/bin/sh
# Install what Harmony needs on a Debian/Ubuntu host, as root: trace-cmd and perf (Debian
# packages, only if missing), what kernels under test need (QEMU, kmod, busybox; virtme-ng from
# PyPI), tracefs and debugfs mounted, and the harmony package itself.
# Usage, as root: ./install.sh  (otherwise: sudo ./install.sh; idempotent: a second run installs
# nothing new)
set -eu
cd "$(dirname "$0")"

if [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: run as root (Harmony records kernel tracepoints): sudo ./install.sh" >&2
    exit 1
fi

missing=""
command -v trace-cmd >/dev/null 2>&1 || missing="$missing trace-cmd"
command -v perf >/dev/null 2>&1 || missing="$missing linux-perf"
python3 -m pip --version >/dev/null 2>&1 || missing="$missing python3-pip"
# kernels under test (harmony run|suite --kernel): QEMU boots them, virtme-ng builds the guest's
# initramfs with kmod's depmod and busybox
command -v qemu-system-x86_64 >/dev/null 2>&1 || missing="$missing qemu-system-x86"
command -v depmod >/dev/null 2>&1 || missing="$missing kmod"
command -v busybox >/dev/null 2>&1 || missing="$missing busybox-static"
# the sched-ext kernel's example schedulers (harmony run --scx) link libelf; the packages that
# build that kernel are installed by `harmony kernel build sched-ext` itself, when it runs
dpkg -s libelf1 >/dev/null 2>&1 || missing="$missing libelf1"
# the kernels compiled ahead of time (python -m harmony.precompile, below): a C compiler and
# Python's headers
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null || missing="$missing python3-dev"
if [ -n "$missing" ]; then
    echo "installing Debian packages:$missing"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
fi

# Harmony mounts tracefs itself when it can; mounting here makes `harmony doctor` complete at once.
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing || \
    echo "install.sh: could not mount tracefs; see 'harmony doctor'" >&2
mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug || \
    echo "install.sh: could not mount debugfs (optional: per-CPU nr_running cross-check)" >&2

# Editable, so the tests in tests/ run against this checkout; the [test] extra adds pytest, the
# [vm] extra virtme-ng (pinned).
python3 -m pip install -q -e '.[test,vm]'
# the modules' bytecode written now: an editable install leaves it to the first import, which
# never writes it where PYTHONDONTWRITEBYTECODE is set (as on the hosts Harmony is developed on):
# every command then compiled its ~100 modules from source, 0.15 s (1.09x a 1 M-event import)
python3 -m compileall -q harmony probes analysis experiments >/dev/null || \
    echo "install.sh: could not write the bytecode: every command compiles Harmony's modules" >&2
# the kernels compiled now (harmony.core.kernels): ahead of time into an extension module, which
# every command loads in ~1 ms without numba, and into numba's cache beside their sources, for what
# the extension lacks, so that the first command is as fast as the next ones (bench/first_use.py);
# a user who cannot write there gets their own caches (~/.cache) on their first large trace
python3 -m harmony.precompile || echo "install.sh: precompiling failed: the first large trace compiles the kernels (~15 s)" >&2
echo "installed: $(command -v harmony)"
