"""The fork server: a small process that forks the workers, so that the controller never forks.

Why: a suite's controller is a 150-190 MB Python process (pandas, pyarrow, numba). Forking it
costs its page tables (~5-8 ms a fork here), and killing the children costs the teardown of their
copy-on-write address spaces. This server is a fresh interpreter that imports the standard library
and :mod:`harmony.workload.worker` only (~15 MB); a fork of it costs under a millisecond. Measured
on a 2-vCPU VM, old and new code back to back: 256 workers spawn in 0.4-0.5 s instead of 1.4-2.3 s
and stop in 0.1 s instead of 0.5-1.1 s; ``harmony suite --quick`` (31 runs) spends 0.9 s instead of
2.4 s spawning, 0.35 s instead of 0.95 s stopping.

One server per controller process, started on first use (:func:`shared`) from a thread that lives
as long as the process, and reused by every workload. The controller talks to it over a
SOCK_SEQPACKET socket pair (JSON requests, one reply each, naming its request's id: a reply whose
caller was stopped by Ctrl-C before reading it is dropped by the next request, which waits for its
own; the server never speaks unasked) and passes each workload's shared page as a memfd
(SCM_RIGHTS). The server forks the workers into one process group, reaps them, and reports their
exit statuses when asked (``poll``); ``stop`` kills the group and replies only once every worker
is reaped.

Hygiene: the server carries PR_SET_PDEATHSIG=SIGKILL tied to the controller (and exits if the
controller died before that was armed); each worker carries it tied to the server and checks the
controller too: a SIGKILLed controller takes the server and every worker with it. At the
controller's exit (atexit) the server kills and reaps its workers and exits; ``harmony clean``
kills a server whose controller is gone (:func:`harmony.hygiene.orphans`).

``HARMONY_FORKSERVER=0`` disables it: the controller forks the workers itself, as it does (and
says so in the workload's notes) when the server cannot start.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from harmony.core.errors import ControllerError, ForkServerError  # noqa: F401  (raised here)
from harmony.core.osutil import PR_SET_NAME, die_with_parent, harmony_python, prctl
from harmony.workload import serve, worker

ENV = "HARMONY_FORKSERVER"
COMM = "harmony-forksrv"  # 15 bytes, the most a comm holds
MAX_MSG = 1 << 18  # a request or reply; the controller sends the tasks in chunks below it
CHUNK = 64  # tasks per fork request


def _send(sock: socket.socket, msg: dict, fds=()) -> None:
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _recv(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the fds it carried; (None, []) at end of file."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MSG, 4)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ForkServerError("a message was truncated")
    return (json.loads(data) if data else None), fds


# -- the controller's side ---------------------------------------------------------------------

class ForkServer:
    """A started fork server and the controller's end of its socket."""

    def __init__(self, timeout_s: float = 10.0, forked: bool = False):
        """A fresh interpreter started (``python -m harmony.workload.forkserver``), or, with
        ``forked``, this process forked (:func:`fork_now`)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            if forked:
                self.proc = _Forked(theirs, mine)
            else:
                # finds this very package, even one that is not installed
                argv, env = harmony_python("harmony.workload.forkserver", str(theirs.fileno()),
                                           str(os.getpid()), site=False)
                self.proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),),
                                             stdin=subprocess.DEVNULL, env=env)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.sock, self.pid, self.owner = mine, self.proc.pid, os.getpid()
        self.broken: str | None = None
        self.sent = 0  # the id of the last request sent (each reply names its request's)
        self._lock = threading.Lock()
        hello = self.request(None, timeout_s=timeout_s)
        if hello.get("ready") != self.pid:
            self.close()
            raise ForkServerError(f"unexpected greeting {hello}")

    def alive(self) -> bool:
        return self.broken is None and self.proc.poll() is None

    def request(self, msg: dict | None, fds=(), timeout_s: float | None = 30.0) -> dict:
        """Send ``msg`` (None: send nothing) and return the reply. Any failure breaks the server:
        it is killed (its workers die with it) and ForkServerError raised."""
        with self._lock:  # one request at a time, whatever the thread
            return self._request(msg, fds, timeout_s)

    def _request(self, msg: dict | None, fds, timeout_s: float | None) -> dict:
        if self.broken:
            raise ForkServerError(self.broken)
        try:
            self.sock.settimeout(timeout_s)
            want = None                 # the greeting, sent unasked, names no request
            if msg is not None:
                self.sent += 1
                want = self.sent
                _send(self.sock, {**msg, "id": want}, fds)
            # the replies to requests whose caller was stopped (Ctrl-C, SIGTERM) before reading
            # them are read and dropped here; one read but lost to the stop was that request's
            reply = self._reply()
            while reply is not None and reply.get("id") != want:
                reply = self._reply()
        except (OSError, ValueError, ForkServerError) as exc:
            why = ("no answer in time" if isinstance(exc, socket.timeout)
                   else str(exc) or type(exc).__name__)
            self._fail(f"fork server {self.pid}: {why}")
        if reply is None:
            self._fail(f"fork server {self.pid} exited (status {self.proc.poll()})")
        if "error" in reply:
            raise ForkServerError(reply["error"])  # the request failed, the server is fine
        return reply

    def _reply(self) -> dict | None:
        reply, fds = _recv(self.sock)
        for fd in fds:
            os.close(fd)
        return reply

    def _fail(self, why: str):
        self.broken = why
        self.close()
        raise ForkServerError(why)

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the server to kill and reap its workers and exit; kill it if it does not."""
        if self.owner != os.getpid():
            return
        self.broken = self.broken or "closed"
        try:
            if self.proc.poll() is None:
                try:
                    self.sock.settimeout(1.0)
                    _send(self.sock, {"op": "quit"})
                except OSError:
                    pass
                try:
                    self.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            self.sock.close()


class _Forked:
    """The fork server forked from this process (:func:`fork_now`), as much of
    subprocess.Popen as :class:`ForkServer` uses: ``pid``, ``poll()``, ``wait()``, ``kill()``."""

    def __init__(self, theirs: socket.socket, mine: socket.socket):
        controller = os.getpid()
        self.pid, self.returncode = os.fork(), None
        if self.pid == 0:       # the server: never returns
            status = 1
            try:
                mine.close()
                null = os.open(os.devnull, os.O_RDONLY)     # not the controller's input
                os.dup2(null, 0)
                os.close(null)
                status = main([str(theirs.fileno()), str(controller)])
            except BaseException:
                import traceback
                traceback.print_exc()
            finally:
                os._exit(status)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:   # reaped by someone else: gone all the same
                pid, status = self.pid, 255 << 8
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        give_up = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if give_up is not None and time.monotonic() > give_up:
                raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


_server: ForkServer | None = None
_failed: str | None = None  # why the server could not start: not tried again by this process
_lock = threading.Lock()
_registered = False  # shutdown() is registered with atexit


def shared() -> tuple[ForkServer | None, str | None]:
    """This process's fork server, started if need be;
    or (None, why the controller forks itself)."""
    global _server, _failed
    if os.environ.get(ENV, "1").strip() == "0":
        return None, f"workers forked by the controller ({ENV}=0)"
    with _lock:
        if _server is not None and _server.alive():
            return _server, None
        note = None
        if _server is not None:
            note = ("fork server restarted "
                    f"({_server.broken or f'exited, status {_server.proc.poll()}'})")
            _server.close()
            _server = None
        if _failed:
            return None, _failed
        try:
            _server = _start()
        except (OSError, ForkServerError) as exc:
            _failed = f"workers forked by the controller: the fork server could not start ({exc})"
            return None, _failed
        return _server, note


def fork_now() -> None:
    """Start this process's fork server (:func:`shared`) now, by forking this process rather than
    starting a fresh interpreter. For a process that has imported what the server needs and
    little more, and has no other thread yet: the guest agent at its start
    (:mod:`harmony.vm.agent`), where a fresh interpreter costs its start and its imports under
    TCG (1.1 s and ~0.5 s of a boot, bench/README.md). Elsewhere (another thread runs, the
    server is disabled or started already) it does nothing: :func:`shared` starts one when asked.
    A fork that fails is left to :func:`shared` too."""
    global _server
    if os.environ.get(ENV, "1").strip() == "0" or not one_thread():
        return
    with _lock:
        if _server is None:
            try:
                _server = ForkServer(forked=True)
            except (OSError, ForkServerError):
                return
            _at_exit()


def _start() -> ForkServer:
    """Start the server from a thread that lives as long as this process: PR_SET_PDEATHSIG fires
    when the *thread* that created the child exits."""
    if threading.current_thread() is threading.main_thread():
        server = ForkServer()
    else:
        got: list = []
        ready = threading.Event()

        def keeper():
            try:
                got.append(ForkServer())
            except BaseException as exc:  # handed to the caller
                got.append(exc)
            ready.set()
            threading.Event().wait()  # never returns

        threading.Thread(target=keeper, name="harmony-forkserver", daemon=True).start()
        ready.wait()
        if isinstance(got[0], BaseException):
            raise got[0]
        server = got[0]
    _at_exit()
    return server


def _at_exit() -> None:
    global _registered
    if not _registered:
        atexit.register(shutdown)
        _registered = True


def shutdown() -> None:
    """Stop this process's fork server (at exit; safe to call any time, it restarts on demand)."""
    global _server
    with _lock:
        if _server is not None:
            _server.close()
            _server = None


def _forget_in_child() -> None:
    """A forked child of the controller (an analysis process) must not hold the server's socket:
    the server would not see the controller close it."""
    global _server, _failed, _lock
    if _server is not None:
        _server.sock.close()
    _server, _failed, _lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def _calibrate_served(pairs: list[list[int]], rounds: int) -> list[int] | None:
    """The server's calibration (:func:`harmony.workload.serve.calibrate_forked`) run by this
    process's fork server; None where there is none (the caller runs it otherwise)."""
    server, _ = shared()
    if server is None:
        return None
    try:
        reply = server.request({"op": "calibrate", "pairs": pairs, "rounds": rounds},
                               timeout_s=serve.CALIBRATION_TIMEOUT_S + 30)
    except ForkServerError as exc:
        raise ControllerError(f"the server's calibration failed: {exc}") from None
    if "failed" in reply:
        raise ControllerError(reply["failed"])
    return reply["ns"]


serve.use_for_calibration(_calibrate_served)


# -- the server's side -------------------------------------------------------------------------

def _c_fork():
    """The C library's fork(), called with the GIL held (ctypes.PyDLL); None where it has none."""
    try:
        fork = ctypes.PyDLL(None, use_errno=True).fork
    except (OSError, AttributeError):
        return None
    fork.restype, fork.argtypes = ctypes.c_int, []
    return fork


_c_fork_fn = _c_fork()


def one_thread() -> bool:
    """Whether this process has a single thread (its tasks in /proc: native threads too)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def lean_fork(alone: bool) -> int:
    """os.fork() for a child that runs Harmony's code only and ends in os._exit (a worker),
    from a process with a single thread (``alone``: :func:`one_thread`, asked once a batch):
    the C library's fork() without CPython's work in the child around it -- the at-fork
    handlers of the modules imported (threading's, random's reseeding) and the runtime's locks
    made anew, which no other thread can hold here. That work writes to the parent's memory
    page by page: ~190 copy-on-write faults a child here, and under TCG a fork, exit and wait
    took 11-13 ms with os.fork() against 5.6-7.0 ms so (bench/README.md). Elsewhere (another
    thread runs, or no C fork is found), os.fork()."""
    if not alone or _c_fork_fn is None:
        return os.fork()
    pid = _c_fork_fn()
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return pid


class _Workload:
    def __init__(self, buf: mmap.mmap, n: int, ngates: int, noccupiers: int, cpus: list[int]):
        self.buf, self.cpus = buf, cpus
        self.shared = worker.Shared(buf, n, ngates, noccupiers)
        self.pgid: int | None = None
        self.unreaped: set[int] = set()
        self.exited: list[list[int]] = []  # [pid, wait status] of each reaped worker


class _Server:
    def __init__(self, sock: socket.socket, controller: int):
        self.sock, self.controller = sock, controller
        self.workloads: dict[int, _Workload] = {}
        self.owner: dict[int, _Workload] = {}  # unreaped pid -> its workload

    def serve(self) -> None:
        _send(self.sock, {"ready": os.getpid()})
        try:
            while True:
                msg, fds = _recv(self.sock)
                if msg is None or msg.get("op") == "quit":
                    break
                try:
                    reply = getattr(self, "op_" + msg["op"])(msg, fds)
                except Exception as exc:  # the request failed: say why, keep serving
                    reply = {"error": f"{type(exc).__name__}: {exc}"}
                finally:
                    for fd in fds:
                        os.close(fd)
                _send(self.sock, {**reply, "id": msg.get("id")})
        finally:
            for wid in list(self.workloads):
                self._stop(wid)

    def op_open(self, msg: dict, fds: list[int]) -> dict:
        nocc = msg.get("noccupiers", 0)
        size = worker.Shared.size(msg["n"], msg["ngates"], nocc)
        buf = mmap.mmap(fds[0], size, flags=mmap.MAP_SHARED)
        self.workloads[msg["wid"]] = _Workload(buf, msg["n"], msg["ngates"], nocc, msg["cpus"])
        return {}

    def op_fork(self, msg: dict, fds: list[int]) -> dict:
        w = self.workloads[msg["wid"]]
        me, pids, alone = os.getpid(), [], one_thread()
        for t in msg["tasks"]:
            pid = lean_fork(alone)
            if pid == 0:  # the worker
                try:
                    self.sock.close()  # the controller sees EOF when the server dies, not later
                    os.setpgid(0, w.pgid or 0)
                    worker.start(t, w.cpus, w.shared, me, self.controller)
                except BaseException:
                    os._exit(1)
                os._exit(0)
            try:  # also from here: no race with the child's own setpgid
                os.setpgid(pid, w.pgid or pid)
            except (PermissionError, ProcessLookupError):
                pass
            w.pgid = w.pgid or pid
            w.unreaped.add(pid)
            self.owner[pid] = w
            pids.append(pid)
        return {"pids": pids, "pgid": w.pgid}

    def op_calibrate(self, msg: dict, fds: list[int]) -> dict:
        """The server's calibration (:func:`harmony.workload.serve.calibrate_forked`) on the
        pairs of CPUs asked for: each pair's process forked from here, not started afresh."""
        try:
            return {"ns": serve.calibrate_forked(msg["pairs"], msg["rounds"],
                                                 in_child=self.sock.close)}
        except ControllerError as exc:
            return {"failed": str(exc)}

    def _reap(self) -> None:
        while self.owner:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            w = self.owner.pop(pid, None)
            if w is not None:
                w.unreaped.discard(pid)
                w.exited.append([pid, status])

    def op_poll(self, msg: dict, fds: list[int]) -> dict:
        """Exit statuses of the workload's workers that have exited so far (reaped now)."""
        self._reap()
        return {"exited": self.workloads[msg["wid"]].exited}

    def op_stop(self, msg: dict, fds: list[int]) -> dict:
        """Kill every worker of the workload; reply once all are reaped."""
        return {"exited": self._stop(msg["wid"])}

    def _stop(self, wid: int) -> list[list[int]]:
        w = self.workloads.pop(wid, None)
        if w is None:
            return []
        w.exited += worker.kill_and_reap(w.pgid, w.unreaped)
        for pid in w.unreaped:
            self.owner.pop(pid, None)
        w.unreaped.clear()
        return w.exited


def main(argv: list[str]) -> int:
    fd, controller = int(argv[0]), int(argv[1])
    if not die_with_parent(controller):  # the controller died before the death signal was armed
        return 1
    prctl(PR_SET_NAME, COMM.encode())
    for sig in (signal.SIGINT, signal.SIGHUP):  # a terminal's Ctrl-C is the controller's to handle
        signal.signal(sig, signal.SIG_IGN)
    gc.freeze()  # what is imported now is never scanned again: fewer copy-on-write faults per fork
    try:
        _Server(socket.socket(fileno=fd), controller).serve()
    except ConnectionError:     # the controller closed its end (stopped by a signal as it
        return 1                # started this server): nothing to serve, nothing to say
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
