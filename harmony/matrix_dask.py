"""The matrix on a Dask distributed cluster: its scheduler hands the cells to workers, one cell per
measuring host at a time, and each cell's directory comes home whole.

Dask distributed (``pip install "harmony-sched[matrix]"``) is imported here only, when a command
asks for a cluster: Harmony works without it, and :func:`require_distributed` says in one line
which extra to install.

- :func:`start_worker` (``harmony worker tcp://HOST:8786``): a Dask worker with one thread and
  the resource ``host=1``, started only where ``harmony doctor``'s verdict is that experiments
  can run; those doctor facts go with every cell it runs.
- :func:`run_cluster` (``harmony matrix PLAN --cluster tcp://HOST:8786``): one task a cell,
  ``resources={"host": 1}``, ``retries=2`` (a cell whose worker died, or that failed, runs again,
  on whichever worker is free), ``pure=False``. A task (:func:`cell_archive`) runs its cell in a
  child process (``python -m harmony.matrix``: a capture needs a main thread for its signal
  handlers, and a child killed with its worker leaves nothing running: PR_SET_PDEATHSIG), in a
  scratch directory of the worker's, and returns it as a tar archive with its sha256, through
  Dask or (``shared``, ``--shared-dir``) written whole into a directory both sides see; the
  submitting side checks the sum, unpacks it into ``.incoming/`` and renames it into ``cells/``.
  A cell to resume (left interrupted, failed mid-way or incomplete) travels to its worker as an
  archive of what it collected, and is resumed there.
  A cell that fails on every try is listed with its reason; Ctrl-C sets a Dask ``Event`` the
  tasks poll (each stops its child, which cleans up as a stopped run does) and cancels the rest.
- A real cell waits while another Harmony run holds its host's lock
  (:class:`harmony.hygiene.HostLock`) rather than fail.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path

from harmony import matrix
from harmony.core.errors import HarmonyError, HostBusy
from harmony.core.osutil import harmony_python

#: how to get what this module needs (setup.cfg's extra)
EXTRA = 'pip install "harmony-sched[matrix]" (Dask distributed)'
#: the resource a measuring host has one of: one cell per host at a time
RESOURCES = {"host": 1}
#: the doctor facts of the worker this process is (harmony worker), sent with each cell
WORKER_FACTS: dict | None = None
#: how often a task looks whether it was asked to stop, and whether the host is free (s)
POLL_S = 1.0
#: set when this worker process is stopped (harmony worker): its running cell stops its child
STOPPING = threading.Event()


class CellStopped(RuntimeError):
    """A cell's child stopped because the matrix was interrupted or its worker is stopping."""


class ClusterError(HarmonyError):
    """The cluster cannot be used: Dask distributed missing, a scheduler unreachable or lost."""


def require_distributed():
    """The ``distributed`` module, or ClusterError naming the extra to install."""
    try:
        import distributed
    except ImportError:
        raise ClusterError(f"a cluster needs Dask distributed, which is not installed: {EXTRA}"
                           ) from None
    return distributed


def _quiet_dask() -> None:
    """Dask's own log lines (connection retries, a traceback per failed task) stay off the
    terminal: what went wrong is said once, per cell."""
    for name in ("distributed", "distributed.client", "distributed.core", "tornado"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def connect(address: str, timeout: float = 10.0):
    """A ``distributed.Client`` of the scheduler at ``address``; ClusterError (one line) when it
    cannot be reached within ``timeout`` seconds."""
    distributed = require_distributed()
    _quiet_dask()
    try:
        return distributed.Client(address, timeout=f"{timeout}s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: {why}") from None


# --- the worker's side ----------------------------------------------------------------------------

def _scratch_root() -> Path:
    root = Path(tempfile.gettempdir()) / "harmony-cells"
    root.mkdir(mode=0o700, exist_ok=True)
    for d in root.glob("cell-*"):       # a killed worker's cells: their owner is gone
        pid = d.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)
    return root


def _stopped(event_name: str | None) -> bool:
    if STOPPING.is_set():
        return True
    if not event_name:
        return False
    import distributed
    try:
        # a worker closes when it loses its scheduler (asking the scheduler would then hang)
        if distributed.get_worker().status.name in ("closing", "closed", "failed",
                                                    "closing_gracefully"):
            return True
    except ValueError:      # not in a worker
        pass
    try:
        client = distributed.get_client()
        if client.status != "running":  # the scheduler gone (asking it would hang): stop
            return True
        return distributed.Event(event_name, client=client).is_set()
    except Exception:       # the scheduler gone: nobody is left to want the cell
        return True


def wait_for_host(event_name: str | None) -> None:
    """Wait while another Harmony run holds this host's lock (a worker does not measure beside
    one); return at once for a host that is free."""
    from harmony.hygiene import HostLock

    while True:
        try:
            HostLock().acquire().release()
            return
        except HostBusy:
            if _stopped(event_name):
                raise RuntimeError("stopped while waiting for the host") from None
            time.sleep(5 * POLL_S)


def cell_archive(cell_dict: dict, event_name: str | None = None, partial: bytes | None = None,
                 shared: str | None = None, tag: str = "harmony") -> dict:
    """Run one cell on this worker (a Dask task) and return its directory as a tar archive:
    ``{"id", "sha256", "record" (cell.json), "wall_s"}`` and either ``"archive"`` (the bytes,
    through Dask) or, ``shared`` (a directory the submitting machine sees too), ``"shared"``:
    the archive's path there, written whole before it is renamed to its name; a cell stopped
    mid-way (Ctrl-C of the matrix, its worker stopped) returns what it collected, through Dask,
    with ``"interrupted": True``. ``partial``: a tar archive of the suite the cell left
    interrupted or incomplete, resumed here. RuntimeError with the cell's one-line reason when it
    failed (Dask retries it)."""
    cell = matrix.Cell.from_dict(cell_dict)
    if shared is not None and not Path(shared).is_dir():
        raise RuntimeError(f"the shared directory {shared} is not there on this worker")
    why = matrix.preflight(cell)       # a host that cannot run it does not wait for its lock
    if why:
        raise RuntimeError(f"cell {cell.id}: {why}")
    if cell.kind != matrix.SIMULATED:
        wait_for_host(event_name)
    scratch = Path(tempfile.mkdtemp(prefix=f"cell-{os.getpid()}-", dir=_scratch_root()))
    t0 = time.monotonic()
    try:
        out = scratch / cell.id
        args = ["--cell", json.dumps(cell_dict), "--out", str(out),
                "--parent", str(os.getpid())]
        if partial is not None:
            _extract(io.BytesIO(partial), scratch, cell.id)
            args.append("--resume")
        if WORKER_FACTS is not None:
            (scratch / "facts.json").write_text(json.dumps(WORKER_FACTS, default=str))
            args += ["--facts", str(scratch / "facts.json")]
        try:
            _run_child(args, scratch / "stderr", event_name)
        except CellStopped:
            if not (out / "suite.json").is_file():
                raise
            # what it collected goes home all the same
            return {"id": cell.id, "interrupted": True, "record": None,
                    "wall_s": time.monotonic() - t0} | _through_dask(out, cell.id)
        record = json.loads((out / matrix.CELL_FILE).read_text())
        result = {"id": cell.id, "record": record, "wall_s": time.monotonic() - t0}
        if shared is None:
            return result | _through_dask(out, cell.id)
        path, digest = _write_shared(out, cell.id, Path(shared), tag)
        return result | {"shared": str(path), "sha256": digest}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _tar(f, directory: Path, name: str) -> None:
    """``directory`` written to the file object ``f`` as an uncompressed tar archive whose one
    top-level entry is ``name``."""
    with tarfile.open(fileobj=f, mode="w") as tar:
        tar.add(directory, arcname=name)


def tar_bytes(directory: Path, name: str) -> bytes:
    """``directory`` as an uncompressed tar archive whose one top-level entry is ``name``."""
    buf = io.BytesIO()
    _tar(buf, directory, name)
    return buf.getvalue()


def _through_dask(directory: Path, name: str) -> dict:
    """A cell's result's ``archive`` (:func:`tar_bytes`) and its ``sha256``."""
    data = tar_bytes(directory, name)
    return {"archive": data, "sha256": hashlib.sha256(data).hexdigest()}


def _write_shared(directory: Path, name: str, shared: Path, tag: str) -> tuple[Path, str]:
    """``directory`` archived into ``shared`` (written as a hidden ``.part``, synced, then
    renamed): (its path, its sha256)."""
    dest = shared / f"{tag}-{name}-{uuid.uuid4().hex[:8]}.tar"
    part = shared / f".{dest.name}.part"
    try:
        with open(part, "wb") as f:
            _tar(f, directory, name)
            f.flush()
            os.fsync(f.fileno())
        with open(part, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        os.rename(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return dest, digest


def _extract(source, into: Path, name: str) -> None:
    """The tar archive ``source`` (a file object or path) unpacked into ``into``; RunError when
    its top-level entry is not ``name`` alone."""
    from harmony.store import RunError

    kw = {"fileobj": source} if hasattr(source, "read") else {"name": source}
    with tarfile.open(mode="r", **kw) as tar:
        names = {m.name.split("/")[0] for m in tar.getmembers()}
        if names != {name}:
            raise RunError(f"cell {name}: its archive holds {sorted(names)}")
        tar.extractall(into, filter="data")


def _run_child(args: list[str], stderr_path: Path, event_name: str | None) -> None:
    argv, env = harmony_python("harmony.matrix", *args)
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        while proc.poll() is None:
            if _stopped(event_name):
                proc.terminate()        # SIGTERM: the run is marked and cleaned up as stopped
                proc.wait(60)
                raise CellStopped("stopped: the matrix was interrupted")
            time.sleep(POLL_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        try:                            # what it forked (a pool drawing figures) goes with it
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc.returncode != 0:
        lines = stderr_path.read_text(errors="replace").strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"the cell's process exited with status "
                           f"{proc.returncode}")


def start_worker(address: str, name: str | None = None, timeout: float = 10.0,
                 check_host: bool = True) -> None:
    """``harmony worker``: check this host (``harmony doctor``; ClusterError with its reasons
    when experiments cannot run here), then serve the scheduler at ``address`` as a worker of one
    thread and the resource ``host=1`` until it is stopped (Ctrl-C, SIGTERM) or the scheduler
    goes."""
    import asyncio

    distributed = require_distributed()
    global WORKER_FACTS
    if check_host:
        from harmony import doctor

        facts = doctor.doctor(mount=True, test_record=False, vm=True)
        if not facts["verdict"]["can_run"]:
            raise ClusterError("this host cannot run experiments: "
                               + "; ".join(facts["verdict"]["reasons"]))
        WORKER_FACTS = facts
    _quiet_dask()

    async def serve():
        async with distributed.Worker(address, nthreads=1, resources=RESOURCES, name=name,
                                      death_timeout=timeout) as worker:
            loop = asyncio.get_running_loop()
            def stop():             # the running cell stops its child; the worker closes
                STOPPING.set()
                asyncio.ensure_future(worker.close())

            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.add_signal_handler(sig, stop)
            await worker.finished()

    try:
        asyncio.run(serve())
    except (OSError, TimeoutError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: {why}") from None


# --- the submitting side --------------------------------------------------------------------------

def unpack(result: dict, out: Path, cell: matrix.Cell) -> Path:
    """A cell's archive (through Dask, or in the shared directory: removed once read) checked
    (its sha256), unpacked into ``out/.incoming`` and renamed into ``out/cells``; what the cell
    had left in ``.partial/`` (resumed into it) then goes. RunError when the sum or the archive
    is wrong, OSError when it cannot be stored (a full disk): nothing half-written stays in
    ``cells/``, nothing collected before is lost."""
    from harmony.store import RunError

    shared = Path(result["shared"]) if result.get("shared") else None
    try:
        if shared is None:
            source = io.BytesIO(result["archive"])
            digest = hashlib.sha256(result["archive"]).hexdigest()
        else:
            try:
                with open(shared, "rb") as f:
                    digest = hashlib.file_digest(f, "sha256").hexdigest()
            except FileNotFoundError:
                raise RunError(f"cell {cell.id}: its archive {shared} is not in the shared "
                               "directory") from None
            source = shared
        if digest != result["sha256"]:
            raise RunError(f"cell {cell.id}: its archive's sha256 does not match: not stored")
        incoming = Path(out) / matrix.INCOMING
        incoming.mkdir(parents=True, exist_ok=True)
        tmp = incoming / cell.id
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _extract(source, incoming, cell.id)
            if result.get("interrupted"):
                return _keep_partial(tmp, out, cell)
            if not (tmp / matrix.CELL_FILE).is_file():
                raise RunError(f"cell {cell.id}: its archive has no {matrix.CELL_FILE}")
            dest = matrix.place(tmp, out, cell)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        if shared is not None:
            shared.unlink(missing_ok=True)
    shutil.rmtree(matrix.partial_dir(out, cell), ignore_errors=True)
    return dest


def _keep_partial(tmp: Path, out: Path, cell: matrix.Cell) -> Path:
    """An interrupted cell's directory (all it collected, what it was resumed from included)
    put in ``.partial/<cell>`` for ``--resume``, in place of what was there."""
    dest = matrix.partial_dir(out, cell)
    old = dest.with_name(f"{cell.id}.replaced")
    if dest.exists():
        shutil.rmtree(old, ignore_errors=True)
        dest.rename(old)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def check_shared(shared: Path) -> Path:
    """``shared`` as a directory this machine can write (a file made and removed there);
    ParameterError (one line) otherwise."""
    from harmony.core.errors import ParameterError

    shared = Path(shared).absolute()
    if not shared.is_dir():
        raise ParameterError(f"--shared-dir {shared}: not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=shared, prefix=".harmony-probe-"):
            pass
    except OSError as exc:
        raise ParameterError(f"--shared-dir {shared}: cannot write there ({exc.strerror})"
                             ) from None
    return shared


def failure_reason(exc: BaseException | None) -> str:
    """A failed task's reason in one line (Dask's KilledWorker named as such)."""
    if exc is None:
        return "cancelled"
    if type(exc).__name__ == "KilledWorker":
        return "its worker died on every try (KilledWorker)"
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def host_workers(client) -> int:
    """How many of the cluster's workers have the resource ``host``."""
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    return sum(1 for w in workers.values() if (w.get("resources") or {}).get("host"))


def run_cluster(plan: matrix.Plan, out: Path, address: str, resume: bool = False,
                quiet: bool = False, timeout: float = 10.0, retries: int = 2,
                client=None, shared: Path | None = None) -> dict:
    """Run ``plan``'s cells on the Dask cluster whose scheduler is at ``address`` (or through
    ``client``), each cell's directory brought home into the matrix directory ``out``
    (:func:`unpack`), through Dask or, ``shared``, through that directory (one the workers see
    at the same path); returns matrix.json's record (:func:`harmony.matrix.finish_record`).
    ``resume``: complete cells are skipped; a cell left interrupted, failed mid-way or
    incomplete goes to its worker with what it collected, and is resumed there."""
    if shared is not None:
        shared = check_shared(shared)
    own = client is None
    client = client or connect(address, timeout)
    try:
        record = matrix.open_matrix(out, plan, resume)
        matrix.write_record(out, record)
        todo, partials, done = [], {}, matrix.complete(out, plan)
        for c in plan.cells:
            if c.id in done:
                continue
            held = matrix.take_up(out, c)
            if held == "whole":         # finished before, not moved in: moved in now
                matrix.place(matrix.partial_dir(out, c), out, c)
                continue
            if held == "suite":
                partials[c.id] = tar_bytes(matrix.partial_dir(out, c), c.id)
            todo.append(c)
        progress = matrix.MatrixProgress(len(plan.cells), len(plan.cells) - len(todo),
                                         quiet=quiet, slots=host_workers(client))
        if not progress.slots:
            progress.show("no worker with the resource host yet: the cells wait for one")
        return _submit_and_collect(client, plan, out, record, todo, progress, retries,
                                   partials, shared)
    finally:
        if own:
            client.close()


def _submit_and_collect(client, plan, out, record, todo, progress, retries, partials,
                        shared) -> dict:
    import distributed

    token = uuid.uuid4().hex[:12]
    event, tag = f"harmony-matrix-stop-{token}", f"harmony-{token}"
    futures = {client.submit(cell_archive, c.to_dict(), event, partials.get(c.id),
                             None if shared is None else str(shared), tag,
                             key=f"harmony-cell-{c.id}-{token}", resources=RESOURCES,
                             retries=retries, pure=False): c for c in todo}
    pending, failures = set(futures), []
    try:
        while pending:
            for f in [f for f in pending if f.done()]:
                if f.status == "cancelled" and client.status != "running":
                    # Dask cancels every future when it loses the scheduler: not their failure
                    raise ClusterError("the connection to the Dask scheduler was lost")
                pending.discard(f)
                _collect(f, futures[f], out, failures, progress)
                record = matrix.finish_record(out, plan, record, failures, "running")
            if client.status not in ("running", "connecting"):
                raise ClusterError("the connection to the Dask scheduler was lost")
            ours = {f.key for f in pending}
            progress.slots = max(1, _ask(host_workers, client))
            # a worker's processing list holds its queued tasks too: one runs per host
            progress.running = min(progress.slots, sum(
                len(set(keys) & ours) for keys in _ask(type(client).processing, client).values()))
            progress.show()
            time.sleep(0.2)
    except BaseException as exc:
        _stop(client, event, pending, distributed,
              lambda f: _collect(f, futures[f], out, failures, progress))
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "incomplete"
        for f in pending:
            failures.append({"cell": futures[f].id, "error": f"not finished: {exc}"
                             if not isinstance(exc, KeyboardInterrupt) else "interrupted"})
        matrix.finish_record(out, plan, record, failures, status)
        raise
    finally:
        if shared is not None:      # archives of tries whose worker died before they were sent
            for left in shared.glob(f"{tag}-*"):
                left.unlink(missing_ok=True)
    return matrix.finish_record(out, plan, record, failures)


def _ask(call, client):
    """``call(client)``: a question to the scheduler; ClusterError (one line) when it is gone."""
    try:
        return call(client)
    except Exception as exc:        # CommClosedError, "ConnectionPool is closed", a timeout
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ClusterError(f"the connection to the Dask scheduler was lost ({why})") from None


def _collect(f, cell, out, failures, progress) -> None:
    """One finished task: its cell unpacked (or its failure listed with the reason)."""
    if f.status == "finished":
        try:
            result = f.result()
            unpack(result, out, cell)
        except (HarmonyError, OSError) as exc:
            failures.append({"cell": cell.id, "error": f"cannot store it: {exc}"})
            progress.failed += 1
            return
        if result.get("interrupted"):
            failures.append({"cell": cell.id, "error": "interrupted on its worker: its runs so "
                             f"far are in {matrix.PARTIAL}/ (--resume goes on from them)"})
            progress.failed += 1
            return
        progress.done += 1
        progress.walls.append(result["record"].get("wall_s") or result["wall_s"])
        return
    try:
        exc = f.exception()
    except Exception as e:      # cancelled, or the scheduler lost it
        exc = e
    failures.append({"cell": cell.id, "error": failure_reason(exc)})
    progress.failed += 1


def _stop(client, event: str, pending: set, distributed, collect) -> None:
    """Ctrl-C or a lost scheduler: the cells not started are cancelled, the running ones told
    to stop (each stops its child and sends home what it collected, ``collect``-ed here and
    taken out of ``pending``), for up to a minute."""
    try:
        distributed.Event(event, client=client).set()
        executing = {k for keys in client.call_stack().values() for k in keys}
        running = [f for f in pending if f.key in executing]
        client.cancel([f for f in pending if f.key not in executing])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(f.done() for f in running):
            time.sleep(0.2)
        for f in running:
            if f.done():
                pending.discard(f)
                collect(f)
        client.cancel(list(pending))
    except Exception:       # the scheduler gone: the workers' cells see it and stop
        pass
