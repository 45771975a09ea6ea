"""Commands for kernels and sched_ext schedulers under test: ``kernel list|build|fetch`` and
``scx list|build``.
"""

from __future__ import annotations

import click

from harmony.cli.common import exit_on_error, fail


@click.group()
def kernel():
    """Kernels under test: the named Debian kernels and the cache (harmony run|suite --kernel)."""


@kernel.command("list")
def kernel_list():
    """The kernels Harmony knows by name, and those in the cache."""
    from harmony.vm import kernels

    click.echo("named kernels (--kernel NAME):")
    for name, (_, what) in kernels.NAMED.items():
        click.echo(f"  {name:16} {what}")
    click.echo("kernels built here (--kernel NAME; harmony kernel build NAME):")
    for name in kernels.BUILT:
        click.echo(f"  {name:16} {kernels.recipe(name)['what']}")
        click.echo(f"  {'':16} {kernels.status(name)}")
    have = kernels.cached()
    click.echo(f"cached in {kernels.cache_dir()}:" if have else
               f"cached: none yet ({kernels.cache_dir()})")
    for k in have:
        how = {"seed": "  (seeded from a reference build)", "build": "  (built here)"}.get(
            k.source.get("from"), "")
        click.echo(f"  {k.spec:16} {k.source.get('package')} {k.source.get('version')}  "
                   f"release {k.release}  {k.image}{how}")


@kernel.command("build")
@click.argument("name")
@click.option("--rebuild", is_flag=True, help="build again even if this configuration is built")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="make's jobs (default: the CPUs)")
def kernel_build(name, rebuild, jobs):
    """Build a kernel from source into the cache (sched-ext: Linux 6.12 with sched_ext and the
    tree's example schedulers; 12-28 min on 2 CPUs), once per configuration. Installs the Debian
    packages the build needs when they are missing (as root)."""
    import time

    from harmony.vm import kernels

    if name not in kernels.BUILT:
        fail(f"unknown kernel to build {name!r}: give one of {', '.join(kernels.BUILT)}", 2)
    t0 = time.monotonic()
    with exit_on_error():
        k = kernels.build(name, rebuild=rebuild, jobs=jobs,
                          progress=lambda line: click.echo(line, err=True))
    took = k.source.get("build_s")
    click.echo(f"{k.describe()}: release {k.release}, {k.image}"
               + (f"; built in {took / 60:.1f} min" if took and time.monotonic() - t0 > 60
                  else ""))


@kernel.command("fetch")
@click.argument("name")
def kernel_fetch(name):
    """Fetch a named Debian kernel into the cache (the newest version apt knows)."""
    from harmony.vm import kernels

    if name not in kernels.NAMED:
        fail(f"unknown kernel {name!r}: give one of {kernels.known_names()}", 2)
    with exit_on_error():
        k = kernels.fetch(name, progress=lambda line: click.echo(line, err=True))
    click.echo(f"{k.spec}: {k.source['package']} {k.source['version']}, release {k.release}, "
               f"{k.image}")


@click.group("scx")
def scx_group():
    """sched_ext schedulers under test (harmony run|suite --scx NAME): which, and building the
    scx project's Rust ones."""


@scx_group.command("list")
def scx_list():
    """The schedulers --scx takes by name, and where each is."""
    from harmony.vm import kernels, scx, scx_build

    click.echo("the kernel tree's examples (built with `harmony kernel build sched-ext`):")
    click.echo(f"  {', '.join(scx.KNOWN)}: {kernels.status('sched-ext')}")
    click.echo("the scx project's Rust schedulers (`harmony scx build NAME`):")
    with exit_on_error():
        for name in scx_build.names():
            click.echo(f"  {name:8} {scx_build.status(name)}")
    click.echo("or the path of any sched_ext scheduler's executable")


@scx_group.command("build")
@click.argument("names", nargs=-1)
@click.option("--rebuild", is_flag=True, help="build again even if this configuration is built")
@click.option("--jobs", "-j", type=click.IntRange(min=1), help="cargo's jobs (default: the CPUs)")
def scx_build_cmd(names, rebuild, jobs):
    """Build the scx project's Rust schedulers from their crates (all of them without NAMES:
    bpfland, rusty, lavd; 1-3 min each on 2 CPUs, the first with the shared dependencies), once
    per configuration. Needs cargo; installs the Debian packages the build needs when missing
    (as root)."""
    from harmony.vm import scx_build

    with exit_on_error():
        which = list(names) or scx_build.names()
        built = scx_build.build(which, rebuild=rebuild, jobs=jobs,
                                progress=lambda line: click.echo(line, err=True))
    for name, path in built.items():
        click.echo(f"{name}: {path}")
