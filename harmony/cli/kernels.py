"""Commands for kernels and sched_ext schedulers under test: ``kernel list|build|fetch`` and
``scx list|build``.
"""

from __future__ import annotations

import click

from harmony.cli.common import exit_on_error, json_option, print_json, quiet_option


def _progress(quiet: bool):
    """What a build or a fetch says as it goes: a line on standard error, none with -q."""
    return (lambda line: None) if quiet else (lambda line: click.echo(line, err=True))


@click.group()
def kernel():
    """Kernels under test: the named Debian kernels and the cache (harmony run|suite --kernel)."""


@kernel.command("list")
@json_option("the named kernels, those built here and those in the cache")
def kernel_list(as_json):
    """The kernels Harmony knows by name, and those in the cache."""
    from harmony.vm import kernels

    if as_json:
        print_json({
            "named": [{"name": n, "what": what} for n, (_, what) in kernels.NAMED.items()],
            "built_here": [{"name": n, "what": kernels.recipe(n)["what"],
                            "status": kernels.status(n)} for n in kernels.BUILT],
            "cache": str(kernels.cache_dir()),
            "cached": [{"spec": k.spec, "package": k.source.get("package"),
                        "version": k.source.get("version"), "release": k.release,
                        "image": str(k.image), "from": k.source.get("from")}
                       for k in kernels.cached()]})
        return
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
@quiet_option
def kernel_build(name, rebuild, jobs, quiet):
    """Build a kernel from source into the cache (sched-ext: Linux 6.12 with sched_ext and the
    tree's example schedulers; 12-28 min on 2 CPUs), once per configuration. Installs the Debian
    packages the build needs when they are missing (as root)."""
    import time

    from harmony.vm import kernels

    if name not in kernels.BUILT:
        raise click.UsageError(f"unknown kernel to build {name!r}: give one of "
                               f"{', '.join(kernels.BUILT)}")
    t0 = time.monotonic()
    with exit_on_error():
        k = kernels.build(name, rebuild=rebuild, jobs=jobs,
                          progress=_progress(quiet))
    took = k.source.get("build_s")
    click.echo(f"{k.describe()}: release {k.release}, {k.image}"
               + (f"; built in {took / 60:.1f} min" if took and time.monotonic() - t0 > 60
                  else ""))


@kernel.command("fetch")
@click.argument("name")
@quiet_option
def kernel_fetch(name, quiet):
    """Fetch a named Debian kernel into the cache (the newest version apt knows)."""
    from harmony.vm import kernels

    if name not in kernels.NAMED:
        raise click.UsageError(f"unknown kernel {name!r}: give one of {kernels.known_names()}")
    with exit_on_error():
        k = kernels.fetch(name, progress=_progress(quiet))
    click.echo(f"{k.spec}: {k.source['package']} {k.source['version']}, release {k.release}, "
               f"{k.image}")


@click.group("scx")
def scx_group():
    """sched_ext schedulers under test (harmony run|suite --scx NAME): which, and building the
    scx project's Rust ones."""


@scx_group.command("list")
@json_option("the schedulers by name and the state of each")
def scx_list(as_json):
    """The schedulers --scx takes by name, and where each is."""
    from harmony.vm import kernels, scx, scx_build

    if as_json:
        with exit_on_error():
            rust = {name: scx_build.status(name) for name in scx_build.names()}
        print_json({"examples": {"names": list(scx.KNOWN), "kernel": "sched-ext",
                                 "status": kernels.status("sched-ext")},
                    "scx": [{"name": n, "status": st} for n, st in rust.items()]})
        return
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
@quiet_option
def scx_build_cmd(names, rebuild, jobs, quiet):
    """Build the scx project's Rust schedulers from their crates (all of them without NAMES:
    bpfland, rusty, lavd; 1-3 min each on 2 CPUs, the first with the shared dependencies), once
    per configuration. Needs cargo; installs the Debian packages the build needs when missing
    (as root)."""
    from harmony.vm import scx_build

    with exit_on_error():
        which = list(names) or scx_build.names()
        built = scx_build.build(which, rebuild=rebuild, jobs=jobs,
                                progress=_progress(quiet))
    for name, path in built.items():
        click.echo(f"{name}: {path}")
