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
- Which worker may take which cell: every worker has ``host=1``; one whose host can measure
  (``harmony doctor``'s verdict: root, a probe) has ``measure=1`` too, and a real cell asks for
  both (:data:`MEASURE`), so a worker that cannot measure (not root) runs the simulated cells
  only and leaves the real ones to the others; it says why in its metric
  :data:`DECLINE_METRIC`, which the submitting side shows while a real cell waits for a worker
  that can take it (and fails it past ``wait_host``).
- A real cell waits while another Harmony run holds its host's lock
  (:class:`harmony.hygiene.HostLock`), said on the worker's stderr and on the submitter's
  progress line (an event on the matrix's topic), and fails with its one-line reason past
  ``wait_host`` seconds (not retried: ``--resume`` runs it again).
- A scheduler that does not answer for ``lost_after`` seconds is lost (a network cut, a stopped
  scheduler: its connections stay open, nothing says they are dead): the submitter says so in
  one line naming its address, and a worker's running cell stops its child (which cleans up as a
  stopped run does).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path

from harmony import matrix, store
from harmony.core.errors import HarmonyError, HostBusy
from harmony.core.wording import plural
from harmony.core.osutil import STOP_SIGNALS, harmony_python

#: how to get what this module needs (setup.cfg's extra)
EXTRA = 'pip install "harmony-sched[matrix]" (Dask distributed)'
#: the resource every worker has one of (one cell per host at a time): a simulated cell asks it
RESOURCES = {"host": 1}
#: what a real cell asks: the host, and a worker whose host can measure (harmony doctor's verdict)
MEASURE = {"host": 1, "measure": 1}
#: the worker metric (its Dask identity's ``metrics``) saying why it takes no real cell
#: (``worker NAME on HOST: cannot measure here: ...``), or None
DECLINE_METRIC = "harmony-declines"
#: why this worker (harmony worker) takes no real cell: harmony doctor's reasons, or None
DECLINES: str | None = None
#: how long a cell waits for a host able and free to run it, by default (s): --wait-host
WAIT_HOST_S = 1800.0
#: a scheduler silent this long is lost (s), by default: --lost-after
LOST_AFTER_S = 30.0
#: this worker says nothing on its stderr (harmony worker -q)
QUIET = False
#: the cells' child processes running in this worker process (stopped before it exits)
CHILDREN: set[subprocess.Popen] = set()
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


class HostWait(RuntimeError):
    """A real cell waited for its host (held by another Harmony run) longer than allowed."""


def resources_of(cell: matrix.Cell) -> dict:
    """The Dask resources a cell's task asks: a real cell a worker that can measure."""
    return RESOURCES if cell.kind == matrix.SIMULATED else MEASURE


def where() -> str:
    """This worker in a line: ``worker NAME on HOST`` (or ``host HOST`` outside a worker)."""
    host = socket.gethostname()
    try:
        import distributed
        return f"worker {distributed.get_worker().name} on {host}"
    except (ImportError, ValueError):
        return f"host {host}"


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


def _stopped(event_name: str | None, lost_after: float = LOST_AFTER_S) -> bool:
    """Whether the running cell is to stop: its worker stopping or closed, the matrix
    interrupted (its Event set), or the scheduler gone or silent for ``lost_after`` s."""
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
        # a bounded question: a scheduler behind a cut network never answers, nor says so
        return bool(client.sync(client.scheduler.event_is_set, name=event_name,
                                callback_timeout=lost_after))
    except Exception:       # the scheduler gone or silent: nobody is left to want the cell
        return True


def _say(text: str) -> None:
    """A line on this worker's stderr (harmony worker's, unless -q)."""
    if not QUIET:
        print(f"worker: {text}", file=sys.stderr, flush=True)


def _tell(topic: str | None, msg: dict) -> None:
    """An event on the matrix's topic, for the submitter's progress line (best effort)."""
    if not topic:
        return
    try:
        import distributed
        distributed.get_worker().log_event(topic, msg)
    except Exception:       # not in a worker, or its scheduler gone: the worker's line stays
        pass


def wait_for_host(event_name: str | None = None, wait_s: float | None = WAIT_HOST_S,
                  notify=None, lost_after: float = LOST_AFTER_S) -> None:
    """Wait while another Harmony run holds this host's lock (a worker does not measure beside
    one), at most ``wait_s`` seconds (None: no bound); return at once for a host that is free.
    ``notify(why, since)``: called when the wait starts or its reason changes, and with
    ``(None, since)`` when it ends. HostWait (one line: who holds the host, since when, how long
    it waited) past ``wait_s``; RuntimeError when the cell is stopped meanwhile."""
    from harmony.hygiene import HostLock

    since, said = None, None
    while True:
        try:
            HostLock().acquire().release()
            if since is not None and notify:
                notify(None, since)
            return
        except HostBusy as exc:
            why = str(exc).split(";")[0]
            if said and "(pid ?)" in why:   # its holder writing or clearing its pid: the same
                why = said
            now = time.time()
            since = since or now
            if why != said and notify:
                notify(why, since)
            said = why
            if wait_s is not None and now - since >= wait_s:
                raise HostWait(f"{why} (since {time.strftime('%H:%M:%S', time.localtime(since))}"
                               f"); gave up after {now - since:.0f} s (--wait-host "
                               f"{wait_s:g})") from None
            if _stopped(event_name, lost_after):
                raise RuntimeError("stopped while waiting for the host") from None
            left = 5 * POLL_S if wait_s is None else max(0.0, wait_s - (now - since))
            time.sleep(min(5 * POLL_S, left))


def cell_archive(cell_dict: dict, event_name: str | None = None, partial: bytes | None = None,
                 shared: str | None = None, tag: str = "harmony",
                 wait_host: float | None = WAIT_HOST_S, lost_after: float = LOST_AFTER_S,
                 topic: str | None = None) -> dict:
    """Run one cell on this worker (a Dask task) and return its directory as a tar archive:
    ``{"id", "sha256", "record" (cell.json), "wall_s"}`` and either ``"archive"`` (the bytes,
    through Dask) or, ``shared`` (a directory the submitting machine sees too), ``"shared"``:
    the archive's path there, written whole before it is renamed to its name; a cell stopped
    mid-way (Ctrl-C of the matrix, its worker stopped) returns what it collected, through Dask,
    with ``"interrupted": True``. ``partial``: a tar archive of the suite the cell left
    interrupted or incomplete, resumed here. RuntimeError with the cell's one-line reason when it
    failed (Dask retries it); a host another Harmony run held for ``wait_host`` seconds returns
    ``{"id", "failed": reason}`` (not retried: the bound is the user's). While it waits, the
    worker's stderr and the submitter's progress (events on ``topic``) say so."""
    cell = matrix.Cell.from_dict(cell_dict)
    if shared is not None and not Path(shared).is_dir():
        raise RuntimeError(f"{where()}: the shared directory {shared} is not there")
    why = matrix.preflight(cell)       # a host that cannot run it does not wait for its lock
    if why:
        raise RuntimeError(f"{where()}: {why}")
    if cell.kind != matrix.SIMULATED:
        def notify(reason, since):
            at = time.strftime("%H:%M:%S", time.localtime(since))
            if reason:
                bound = "" if wait_host is None else f", for at most {wait_host:g} s"
                _say(f"cell {cell.id} waits: {reason} (since {at}{bound})")
            else:
                _say(f"cell {cell.id}: the host is free, it starts")
            _tell(topic, {"cell": cell.id, "where": where(), "why": reason, "since": since})
        try:
            wait_for_host(event_name, wait_host, notify, lost_after)
        except HostWait as exc:
            _say(f"cell {cell.id} failed: {exc}")
            return {"id": cell.id, "failed": f"{where()}: {exc}"}
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
            _run_child(args, scratch / "stderr", event_name, lost_after)
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


def _run_child(args: list[str], stderr_path: Path, event_name: str | None,
               lost_after: float = LOST_AFTER_S) -> None:
    argv, env = harmony_python("harmony.matrix", *args)
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    CHILDREN.add(proc)
    try:
        while proc.poll() is None:
            if _stopped(event_name, lost_after):
                _stop_child(proc)
                raise CellStopped("stopped: the matrix was interrupted")
            time.sleep(POLL_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        CHILDREN.discard(proc)
        try:                            # what it forked (a pool drawing figures) goes with it
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc.returncode != 0:
        lines = stderr_path.read_text(errors="replace").strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"the cell's process exited with status "
                           f"{proc.returncode}")


def _stop_child(proc: subprocess.Popen, wait_s: float = 60.0) -> None:
    """SIGTERM to a cell's child: its run is marked and cleaned up as a stopped run is (its
    workload, tracing instance, VM gone); SIGKILL past ``wait_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_worker(address: str, name: str | None = None, timeout: float = 10.0,
                 check_host: bool = True, quiet: bool = False) -> str | None:
    """``harmony worker``: check this host (``harmony doctor``), then serve the scheduler at
    ``address`` as a worker of one thread until it is stopped (Ctrl-C, SIGTERM) or the
    scheduler goes: with the resources ``host=1, measure=1`` where experiments can run, with
    ``host=1`` alone where they cannot (not root, ...: it runs simulated cells only, and says
    why in one line, returned here, and in its metric :data:`DECLINE_METRIC`). Before it returns
    the cell it was running has stopped its child (cleaned up as a stopped run is)."""
    distributed = require_distributed()
    from distributed.worker import DEFAULT_METRICS

    global WORKER_FACTS, DECLINES, QUIET
    QUIET = quiet
    resources = MEASURE
    if check_host:
        from harmony import doctor

        facts = doctor.doctor(mount=True, test_record=False, vm=True)
        WORKER_FACTS = facts
        if not facts["verdict"]["can_run"]:
            # doctor's first reason, to its colon: "not running as root (euid 1000)"
            head = (facts["verdict"]["reasons"] or ["no probe can record"])[0].split(":")[0]
            DECLINES = f"cannot measure here: {head} (harmony doctor says more)"
            resources = RESOURCES
            _say(f"{DECLINES}: it runs simulated cells only, real cells go to other workers")
    _quiet_dask()
    metrics = {**DEFAULT_METRICS, DECLINE_METRIC: lambda w: DECLINES and
               f"worker {w.name} on {socket.gethostname()}: {DECLINES}"}

    async def serve():
        async with distributed.Worker(address, nthreads=1, resources=resources, name=name,
                                      death_timeout=timeout, metrics=metrics) as worker:
            loop = asyncio.get_running_loop()
            def stop():             # the running cell stops its child; the worker closes
                STOPPING.set()
                asyncio.ensure_future(worker.close())

            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, stop)
            await worker.finished()

    try:
        asyncio.run(serve())
    except (OSError, TimeoutError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: {why}") from None
    finally:
        # a worker that lost its scheduler closes without waiting for its cell's thread: the
        # child (killed with this process otherwise) is stopped here, and cleans up
        STOPPING.set()
        for proc in list(CHILDREN):
            _stop_child(proc)
    return DECLINES


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


def host_workers(workers: dict) -> int:
    """How many of the cluster's ``workers`` (the scheduler's identity: address -> its facts)
    have the resource ``host``."""
    return sum(1 for w in workers.values() if (w.get("resources") or {}).get("host"))


def lost(address: str, why: str) -> ClusterError:
    """The one line of a scheduler lost mid-matrix, naming it."""
    return ClusterError(f"lost the Dask scheduler at {address}: {why}")


def _ask(client, address: str, lost_after: float, call, **kw):
    """``call(**kw)`` (a coroutine function of the client's, such as one of
    ``client.scheduler``'s) answered within ``lost_after`` s; ClusterError (one line, naming
    ``address``) when the scheduler is gone or silent (a network cut: nothing says so)."""
    try:
        return client.sync(call, callback_timeout=lost_after, **kw)
    except (TimeoutError, asyncio.TimeoutError):
        raise lost(address, f"no answer for {lost_after:g} s (the network cut, or the "
                            "scheduler stopped)") from None
    except Exception as exc:        # CommClosedError, "ConnectionPool is closed"
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise lost(address, f"its connection closed ({why})") from None


def run_cluster(plan: matrix.Plan, out: Path, address: str | None, resume: bool = False,
                quiet: bool = False, timeout: float = 10.0, retries: int = 2,
                client=None, shared: Path | None = None,
                wait_host: float | None = WAIT_HOST_S, lost_after: float = LOST_AFTER_S) -> dict:
    """Run ``plan``'s cells on the Dask cluster whose scheduler is at ``address`` (or through
    ``client``), each cell's directory brought home into the matrix directory ``out``
    (:func:`unpack`), through Dask or, ``shared``, through that directory (one the workers see
    at the same path); returns matrix.json's record (:func:`harmony.matrix.finish_record`).
    ``resume``: complete cells are skipped; a cell left interrupted, failed mid-way or
    incomplete goes to its worker with what it collected, and is resumed there.
    ``wait_host``: how long a cell waits for a host that can run it and is free (None: no
    bound): past it the cell fails with the reason. ``lost_after``: a scheduler that does not
    answer this long is lost (ClusterError naming it; the cells not collected listed so)."""
    if shared is not None:
        shared = check_shared(shared)
    own = client is None
    client = client or connect(address, timeout)
    address = address or client.scheduler.address
    record = None
    try:
        with store.new_run_dir(out):    # stopped before matrix.json: no directory left
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
                                         quiet=quiet)
        run = _Run(client, address, plan, out, record, progress, wait_host, lost_after)
        return run.go(todo, retries, partials, shared)
    except BaseException as exc:    # before its cells were sent (go marks it from there on)
        matrix.mark_if_running(out, plan, record, [], "interrupted" if isinstance(
            exc, KeyboardInterrupt) else "incomplete")
        raise
    finally:
        if own:
            try:
                client.close(timeout=min(timeout, lost_after))
            except Exception:       # a scheduler gone or silent: nothing left to close
                pass


class _Run:
    """The submitting side of one matrix on a cluster: its cells' futures, what they came to,
    the lines it shows."""

    def __init__(self, client, address, plan, out, record, progress, wait_host, lost_after):
        self.client, self.address, self.plan, self.out = client, address, plan, out
        self.record, self.progress = record, progress
        self.wait_host, self.lost_after = wait_host, lost_after
        self.failures: list[dict] = []
        self.waiting: dict[str, dict] = {}      # cell -> its worker's last word on its host
        self.homeless: dict[str, float] = {}    # resources asked -> since when no worker has them

    def ask(self, call, **kw):
        return _ask(self.client, self.address, self.lost_after, call, **kw)

    def on_event(self, event) -> None:
        """A worker's word on a cell waiting for its host (the client's thread)."""
        msg = event[1] if isinstance(event, tuple) else event
        if isinstance(msg, dict) and "cell" in msg:
            if msg.get("why"):
                self.waiting[msg["cell"]] = msg
            else:
                self.waiting.pop(msg["cell"], None)

    def go(self, todo, retries, partials, shared) -> dict:
        client = self.client
        token = uuid.uuid4().hex[:12]
        event, tag = f"harmony-matrix-stop-{token}", f"harmony-{token}"
        topic = f"harmony-matrix-{token}"
        try:
            client.subscribe_topic(topic, self.on_event)
        except Exception:       # the scheduler already gone: the first question says so
            pass
        self.futures = futures = {
            client.submit(cell_archive, c.to_dict(), event, partials.get(c.id),
                          None if shared is None else str(shared), tag, self.wait_host,
                          self.lost_after, topic, key=f"harmony-cell-{c.id}-{token}",
                          resources=resources_of(c), retries=retries, pure=False): c
            for c in todo}
        pending = set(futures)
        try:
            while pending:
                for f in [f for f in pending if f.done()]:
                    if f.status == "cancelled" and client.status != "running":
                        # Dask cancels every future when it loses the scheduler: not their
                        # failure
                        raise lost(self.address, "its connection closed")
                    pending.discard(f)
                    self.collect(f)
                    self.record = matrix.finish_record(self.out, self.plan, self.record,
                                                       self.failures, "running")
                if client.status not in ("running", "connecting"):
                    raise lost(self.address, "its connection closed")
                self.look(pending)
                time.sleep(0.2)
        except BaseException as exc:
            if not isinstance(exc, ClusterError):       # a lost scheduler cannot be told
                _stop(client, event, pending, self.collect, self.lost_after)
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "incomplete"
            for f in pending:
                self.failures.append({"cell": futures[f].id, "error": f"not finished: {exc}"
                                      if not isinstance(exc, KeyboardInterrupt)
                                      else "interrupted"})
            matrix.finish_record(self.out, self.plan, self.record, self.failures, status)
            raise
        finally:
            if shared is not None:      # archives of tries whose worker died before sending
                for left in shared.glob(f"{tag}-*"):
                    left.unlink(missing_ok=True)
            try:
                client.unsubscribe_topic(topic)
            except Exception:
                pass
        return matrix.finish_record(self.out, self.plan, self.record, self.failures)

    def look(self, pending: set) -> None:
        """The cluster asked (within ``lost_after``) what runs where: the progress line, with
        the cells that wait for a host; the cells no worker can take failed past
        ``wait_host``."""
        workers = self.ask(self.client.scheduler.identity, n_workers=-1).get("workers", {})
        processing = self.ask(self.client.scheduler.processing)
        ours = {f.key for f in pending}
        self.progress.slots = max(1, host_workers(workers))
        # a worker's processing list holds its queued tasks too: one runs per host
        self.progress.running = min(self.progress.slots, sum(
            len(set(keys) & ours) for keys in processing.values()))
        notes = self.homeless_cells(pending, workers)
        for cell, msg in sorted(self.waiting.items()):
            if any(self.futures[f].id == cell for f in pending):
                at = time.strftime("%H:%M:%S", time.localtime(msg["since"]))
                notes.append(f"cell {cell} waits on {msg['where']}: {msg['why']}, since {at}")
        self.progress.show("; ".join(notes))

    def homeless_cells(self, pending: set, workers: dict) -> list[str]:
        """The notes on the pending cells no worker can take (none has their resources), and
        those cells failed once they have waited ``wait_host``."""
        notes = []
        for kind, asked in (("simulated", RESOURCES), ("real", MEASURE)):
            cells = [f for f in pending if resources_of(self.futures[f]) is asked]
            able = [w for w in workers.values()
                    if all((w.get("resources") or {}).get(r, 0) >= n for r, n in asked.items())]
            if not cells or able:
                self.homeless.pop(kind, None)
                continue
            since = self.homeless.setdefault(kind, time.time())
            others = [(w.get("metrics") or {}).get(DECLINE_METRIC)
                      or f"worker {w.get('name')} on {w.get('host')}: no resource "
                      + ", ".join(r for r in asked if not (w.get("resources") or {}).get(r))
                      for w in workers.values()]
            why = (f"no worker can run a {kind} cell" + (": " + "; ".join(others) if others
                                                          else " (no worker yet)"))
            waited = time.time() - since
            if self.wait_host is not None and waited >= self.wait_host:
                self.client.cancel(cells)
                for f in cells:
                    pending.discard(f)
                    self.fail(self.futures[f].id, f"{why}; gave up after {waited:.0f} s "
                                                  f"(--wait-host {self.wait_host:g})")
                self.record = matrix.finish_record(self.out, self.plan, self.record,
                                                   self.failures, "running")
                self.homeless.pop(kind, None)
                continue
            notes.append(f"{plural(len(cells), f'{kind} cell')} wait: "
                         f"{why}")
        return notes

    def collect(self, f) -> None:
        """One finished task: its cell unpacked (or its failure listed with the reason)."""
        cell, progress, out = self.futures[f], self.progress, self.out
        self.waiting.pop(cell.id, None)
        if f.status == "finished":
            try:
                result = f.result()
                if result.get("failed"):
                    self.fail(cell.id, result["failed"])
                    return
                unpack(result, out, cell)
            except (HarmonyError, OSError) as exc:
                self.fail(cell.id, f"cannot store it: {exc}")
                return
            if result.get("interrupted"):
                self.fail(cell.id, "interrupted on its worker: its runs so far are in "
                                   f"{matrix.PARTIAL}/ (--resume goes on from them)")
                return
            progress.done += 1
            progress.walls.append(result["record"].get("wall_s") or result["wall_s"])
            return
        try:
            exc = f.exception()
        except Exception as e:      # cancelled, or the scheduler lost it
            exc = e
        self.fail(cell.id, failure_reason(exc))

    def fail(self, cell_id: str, error: str) -> None:
        """A cell that came to nothing: listed with its reason, counted on the progress line."""
        self.failures.append({"cell": cell_id, "error": error})
        self.progress.failed += 1


def _stop(client, event: str, pending: set, collect, lost_after: float = LOST_AFTER_S) -> None:
    """Ctrl-C: the cells not started are cancelled, the running ones told to stop (each stops
    its child and sends home what it collected, ``collect``-ed here and taken out of
    ``pending``), for up to a minute; nothing is waited for from a scheduler silent for
    ``lost_after`` seconds."""
    try:
        client.sync(client.scheduler.event_set, name=event, callback_timeout=lost_after)
        executing = {k for keys in client.sync(client.scheduler.call_stack, keys=None,
                                               callback_timeout=lost_after).values()
                     for k in keys}
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
