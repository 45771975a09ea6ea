"""The bodies of a server-shaped workload's tasks (the ``server`` experiment), and their records.

Imports the standard library only (and :mod:`harmony.core.errors`): like
:mod:`harmony.workload.worker`, which calls it, it runs in the fork server's children, and the guest
agent places its tasks (:func:`place`). A task whose :attr:`harmony.workload.tasks.TaskSpec.serve`
is set runs one of these parts instead of the duty-cycle loop: :func:`prepare` does what must be
done before the start gate (bind and listen, open the stage pipes and the records file), and the
function it returns runs from the release on and never returns (the task is killed with the
workload).

Parts (``kind`` in the JSON of ``serve``):

- ``client``: the open-loop client. After its gate it connects one AF_UNIX stream socket per
  connection (abstract addresses: nothing is left in the file system; they vanish with the
  listening task), waits for t0, then sends requests at Poisson arrivals of ``rate`` per second,
  each on a connection drawn uniformly (so each connection is a Poisson stream of rate/conns),
  each asking ``work_ns`` of CPU time drawn from ``sizes`` (exponential of mean ``work_ns``,
  Pareto of shape ``alpha`` with the same mean, or fixed). Open loop: it never waits for a
  response to send the next request; one it could not send at its arrival (a full socket) keeps
  its arrival time. It stops sending, and records why, when more than ``max_outstanding`` requests
  are unanswered (the server cannot keep up: an open loop would queue forever).
- ``conn``: thread-per-connection: one task owns connection ``conn``: receive, work, answer.
- ``reader``: pool-per-stage's I/O stage: one task reads every connection and writes each request
  into the first stage's pipe, reads the last stage's answers from the answer pipe and sends
  them on their connection.
- ``stage``: pool-per-stage's worker of stage ``stage``: its pool's tasks all read the same pipe
  (a named FIFO; 64-byte writes and reads are atomic, so each request goes to one worker), do
  the stage's share of the work and write it into the next stage's pipe.
- ``loop``: an event loop (Flash without helpers; ``thread-per-core`` runs one per CPU, pinned):
  accepts its connections and serves every request inline, one at a time, in arrival order.

Each part's work on a request is ``block_ns`` asleep (a disk-like wait) then its share of the
request's CPU work, burnt in the worker's calibrated loop (CPU time of the thread, so a
preempted task still does exactly the work asked).

Records (one file per task in ``records``, appended by one ``write`` each, so a task killed at
the end leaves whole records but maybe the last): every record is :data:`REC`, six int64 on
CLOCK_MONOTONIC, the trace's clock:

- the client's, one as it sends a request (``client.sent``) and one as it reads its answer
  (``client.done``): request id, connection, arrival (when it was due), sent (when the client
  made it: later than arrival when the client itself was late), done (when its answer was read;
  0 in ``client.sent``), work (ns of CPU asked); in ``client.sent``, id :data:`OVERLOAD` marks
  where it stopped sending (connection field: the requests unanswered then);
- every serving part's (``<name>.stage``): request id, stage (1.. for work stages; 0 and
  :data:`ANSWER` for the pool's reader taking it in and sending the answer), pid, start, end, 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import random
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

from harmony.core.errors import ControllerError
from harmony.core.osutil import harmony_python

#: one request on the wire, 64 bytes: id, connection, arrival (ns), work (ns), then unused
MSG = struct.Struct("<qqqqqqqq")
#: one record of a records file (see the module docstring)
REC = struct.Struct("<qqqqqq")
#: the client's record of where it stopped sending (id field)
OVERLOAD = -1
#: stage number of the pool reader's record of an answer sent
ANSWER = 1000
#: where a run's tasks write their records, under its raw/ directory
RECORDS_DIR = "requests"
SENT_FILE = "client.sent"
DONE_FILE = "client.done"
STAGE_SUFFIX = ".stage"
F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20       # the most an unprivileged pipe may hold by default (pipe-max-size)


def mono() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def address(token: str, what: str) -> bytes:
    """The abstract AF_UNIX address of one listening socket of the run ``token``."""
    return b"\0hmy-" + token.encode() + b"-" + what.encode()


#: what a part listens on, by kind (its address: :func:`address`)
_LISTENS = {"conn": lambda part: f"c{part['conn']}", "reader": lambda part: "r",
            "loop": lambda part: f"l{part['loop']}"}


def prepare(text: str, burn, seed: int = 0):
    """The part ``text`` (the JSON of TaskSpec.serve) made ready before the start gate; returns
    its body, called with the shared page's cells once the gate opens. ``burn(ns)``: the worker's
    calibrated loop, ``ns`` of this thread's CPU time; ``seed``: the task's (the client's draws)."""
    cfg = {**json.loads(text), "seed": seed}
    parts = {"client": _client, "conn": _conn, "reader": _reader, "stage": _stage, "loop": _loop}
    return parts[cfg["kind"]](cfg, burn)


def _records(cfg: dict, name: str) -> int:
    return os.open(os.path.join(cfg["records"], name), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                   0o644)


def _listen(cfg: dict, what: str, backlog: int) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(address(cfg["token"], what))
    s.listen(backlog)
    return s


def _work(cfg: dict, work_ns: int, burn) -> None:
    if cfg.get("block_ns"):
        time.sleep(cfg["block_ns"] / 1e9)
    if work_ns > 0:
        burn(work_ns)


def _messages(buf: bytearray):
    """Whole messages at the head of ``buf`` (removed from it)."""
    n = len(buf) // MSG.size * MSG.size
    out = [bytes(buf[i:i + MSG.size]) for i in range(0, n, MSG.size)]
    del buf[:n]
    return out


def _open_pipe(path: str) -> int:
    """A stage pipe, opened read-write (never blocks at open, never reads EOF), made large."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass
    return fd


def sizes(cfg: dict, rng: random.Random):
    """A function drawing one request's work (ns): exponential of mean ``work_ns``, Pareto of
    shape ``alpha`` (> 1) and minimum work_ns * (alpha - 1) / alpha, which has the same mean, or
    ``fixed``: work_ns every time."""
    mean = cfg["work_ns"]
    if cfg["sizes"] == "fixed":
        return lambda: mean
    if cfg["sizes"] == "pareto":
        alpha = cfg["alpha"]
        xm = mean * (alpha - 1) / alpha
        return lambda: int(xm * rng.paretovariate(alpha))
    return lambda: int(rng.expovariate(1.0 / mean))


def _client(cfg: dict, burn):
    sent_rec, rec = _records(cfg, SENT_FILE), _records(cfg, DONE_FILE)

    def body(cells):
        socks = []
        for target in cfg["targets"]:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(address(cfg["token"], target))
            s.setblocking(False)
            socks.append(s)
        conn_of = {s.fileno(): c for c, s in enumerate(socks)}
        while not cells[0]:             # t0: written at the end of a warm-up, before a cold release
            time.sleep(0.0005)
        rng = random.Random(cfg["seed"])
        draw, rate, nconn = sizes(cfg, rng), cfg["rate"], len(socks)
        pending = [bytearray() for _ in socks]
        inbuf = [bytearray() for _ in socks]
        outstanding: dict[int, tuple] = {}
        rid, due, sending = 0, int(cells[0]) + int(rng.expovariate(rate) * 1e9), True
        while True:
            now = mono()
            new = []
            while sending and now >= due:
                conn, work = rng.randrange(nconn), draw()
                pending[conn] += MSG.pack(rid, conn, due, work, 0, 0, 0, 0)
                outstanding[rid] = (conn, due, now, work)
                new.append(REC.pack(rid, conn, due, now, 0, work))
                rid += 1
                due += int(rng.expovariate(rate) * 1e9)
                if len(outstanding) > cfg["max_outstanding"]:
                    sending = False
                    new.append(REC.pack(OVERLOAD, len(outstanding), now, 0, 0, 0))
            if new:
                os.write(sent_rec, b"".join(new))
            writing = []
            for c, data in enumerate(pending):
                if data:
                    try:
                        del data[:socks[c].send(data)]
                    except BlockingIOError:
                        pass
                    if data:
                        writing.append(socks[c])
            timeout = max(0, due - mono()) / 1e9 if sending else None
            readable, _, _ = select.select(socks, writing, [], timeout)
            out = []
            for s in readable:
                c = conn_of[s.fileno()]
                data = s.recv(1 << 16)
                if not data:
                    os._exit(2)         # the server went away: the workload is broken
                inbuf[c] += data
                done = mono()
                for msg in _messages(inbuf[c]):
                    got = MSG.unpack(msg)[0]
                    conn, due_at, sent, work = outstanding.pop(got)
                    out.append(REC.pack(got, conn, due_at, sent, done, work))
            if out:
                os.write(rec, b"".join(out))
    return body


def _serve_one(cfg: dict, burn, rec: int, msg: bytes, stage: int, work_ns: int) -> None:
    start = mono()
    _work(cfg, work_ns, burn)
    os.write(rec, REC.pack(MSG.unpack(msg)[0], stage, os.getpid(), start, mono(), 0))


def _conn(cfg: dict, burn):
    listener = _listen(cfg, _LISTENS["conn"](cfg), 1)
    rec = _records(cfg, cfg["name"] + STAGE_SUFFIX)

    def body(cells):
        s, _ = listener.accept()
        listener.close()
        while True:
            msg = s.recv(MSG.size, socket.MSG_WAITALL)
            if len(msg) < MSG.size:
                os._exit(2)
            _serve_one(cfg, burn, rec, msg, 1, MSG.unpack(msg)[3])
            s.sendall(msg)
    return body


class _Conns:
    """A listening socket and the connections it accepts, read as whole messages."""

    def __init__(self, listener: socket.socket):
        self.listener, self.socks, self.bufs = listener, [listener], {}

    def wait(self, fds=()) -> tuple[list, list]:
        """Block until a connection or one of ``fds`` is readable; returns the whole messages
        received, as (socket, message), and the ``fds`` ready. A connection the client closed
        ends the task (the workload is broken)."""
        readable, _, _ = select.select(self.socks + list(fds), [], [])
        got, ready = [], []
        for s in readable:
            if s is self.listener:
                c, _ = self.listener.accept()
                self.socks.append(c)
                self.bufs[c.fileno()] = bytearray()
            elif not isinstance(s, socket.socket):
                ready.append(s)
            else:
                data = s.recv(1 << 16)
                if not data:
                    os._exit(2)
                buf = self.bufs[s.fileno()]
                buf += data
                got += [(s, msg) for msg in _messages(buf)]
        return got, ready


def _loop(cfg: dict, burn):
    conns = _Conns(_listen(cfg, _LISTENS["loop"](cfg), cfg["conns"]))
    rec = _records(cfg, cfg["name"] + STAGE_SUFFIX)

    def body(cells):
        while True:
            for s, msg in conns.wait()[0]:
                _serve_one(cfg, burn, rec, msg, 1, MSG.unpack(msg)[3])
                s.sendall(msg)
    return body


def _reader(cfg: dict, burn):
    conns = _Conns(_listen(cfg, _LISTENS["reader"](cfg), cfg["conns"]))
    rec = _records(cfg, cfg["name"] + STAGE_SUFFIX)
    first, answers = _open_pipe(cfg["pipes"][0]), _open_pipe(cfg["pipes"][-1])

    def body(cells):
        sock_of, pid = {}, os.getpid()
        while True:
            got, ready = conns.wait([answers])
            for s, msg in got:
                start = mono()
                rid, conn = MSG.unpack(msg)[:2]
                sock_of[conn] = s
                os.write(first, msg)
                os.write(rec, REC.pack(rid, 0, pid, start, mono(), 0))
            if ready:
                for msg in _messages(bytearray(os.read(answers, 256 * MSG.size))):
                    start = mono()
                    rid, conn = MSG.unpack(msg)[:2]
                    sock_of[conn].sendall(msg)
                    os.write(rec, REC.pack(rid, ANSWER, pid, start, mono(), 0))
    return body


def _stage(cfg: dict, burn):
    k, nstages = cfg["stage"], cfg["stages"]
    rec = _records(cfg, cfg["name"] + STAGE_SUFFIX)
    src, dst = _open_pipe(cfg["pipes"][k - 1]), _open_pipe(cfg["pipes"][k])

    def body(cells):
        while True:
            msg = os.read(src, MSG.size)
            if len(msg) != MSG.size:
                os._exit(2)
            work = MSG.unpack(msg)[3]
            _serve_one(cfg, burn, rec, msg, k,
                       work // nstages + (work % nstages if k == nstages else 0))
            os.write(dst, msg)
    return body


#: the most one way of :func:`measure_overhead` may take (a TCG guest's takes a few seconds)
CALIBRATION_TIMEOUT_S = 120


def measure_overhead(cpus: list[int], rounds: int = 2000) -> int:
    """CPU time (ns) one task spends on a request besides its work, measured now by
    :func:`calibrate` (2000 round trips), in the fair class whatever the caller's, with every
    CPU of ``cpus`` busy at once as in a run, in the two ways a request's hop goes: across two
    CPUs (the first and second, the third and fourth...: a wake-up of another CPU) and within
    one (a pair on each CPU: a switch between two processes); the dearer of the two means.

    On a host's own CPUs a hop across is the dearer (21-25 us here against 2.7-2.9 us for a
    switch), and the pairs barely touch one another. In a TCG guest (one host thread runs the
    vCPUs in turn) a switch is: it flushes the emulated TLB, which the process then fills again
    page by page; a hop cost 54 us across two vCPUs of four idle, 125 us within one, ~620 us
    within each of the four at once, which is what the pool's stages spent on a request besides
    its work there (~650 us; 2026-11-26, bench/README.md). ControllerError if it failed."""
    across = [cpus[k:k + 2] for k in range(0, len(cpus) - 1, 2)]
    within = [[c, c] for c in cpus]
    return max(int(sum(ns) / len(ns)) for ns in (_calibrate_at_once(across, rounds),
                                                 _calibrate_at_once(within, rounds)) if ns)


#: how a calibration's pairs are run where a fork server can run them (set by
#: :mod:`harmony.workload.forkserver` as it is imported: it asks the server, and says None where
#: there is none); None: in processes of their own
_served_calibration = None


def use_for_calibration(fn) -> None:
    """Have ``fn(pairs, rounds)`` run a calibration's pairs (ns per hop by pair, or None where it
    cannot: then :func:`_calibrate_started` does)."""
    global _served_calibration
    _served_calibration = fn


def _calibrate_at_once(pairs: list[list[int]], rounds: int) -> list[int]:
    """:func:`calibrate` on each pair of CPUs of ``pairs``, their timed rounds started together;
    ns per hop, by pair. Each pair runs in a process forked by the fork server
    (:func:`calibrate_forked` there: a fork of a small process costs a few ms, where a fresh
    ``python -m harmony.workload.serve`` costs its start and imports: 2-2.5 s each in a TCG guest
    over 9p, bench/README.md), or, where the server cannot be used, in one of its own
    (:func:`_calibrate_started`). A pair that takes more than ``CALIBRATION_TIMEOUT_S`` is
    killed: ControllerError."""
    got = _served_calibration(pairs, rounds) if _served_calibration is not None else None
    return got if got is not None else _calibrate_started(pairs, rounds)


def calibrate_forked(pairs: list[list[int]], rounds: int, in_child=None,
                     timeout_s: float = CALIBRATION_TIMEOUT_S) -> list[int]:
    """:func:`calibrate` on each pair of ``pairs`` in a child forked from this process (the fork
    server's), in the fair class; each says it is warm on its pipe, and once all are, closing the
    one pipe they wait on starts their timed rounds together. ns per hop, by pair.
    ``in_child()``, if given, runs first in each child (the server closes its socket there).
    ControllerError if a pair failed or took over ``timeout_s``; every child is reaped."""
    deadline = time.monotonic() + timeout_s
    go_r, go_w = os.pipe()
    kids: list[tuple[int, int]] = []        # (pid, its pipe's read end)
    try:
        for pair in pairs:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                _calibration_child(pair, rounds, go_r, (go_w, r, *(fd for _, fd in kids)), w,
                                   in_child)
            os.close(w)
            kids.append((pid, r))
        warm = [_read_until(fd, 1, deadline, timeout_s, pairs) for _, fd in kids]
        failed = [(w, fd) for w, (_, fd) in zip(warm, kids) if w != b"w"]
        if failed:                          # said why instead of warm: the others never start
            outs = [failed[0][0] + _read_until(failed[0][1], 256, deadline, timeout_s, pairs)]
        else:
            os.close(go_w)
            go_w = -1
            outs = [w + _read_until(fd, 256, deadline, timeout_s, pairs)
                    for w, (_, fd) in zip(warm, kids)]
    finally:
        for fd in (go_r, go_w, *(fd for _, fd in kids)):
            if fd >= 0:
                os.close(fd)
        for pid, _ in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    for out in outs:
        if len(out) != 9 or out[:1] != b"w":
            raise ControllerError("the server's calibration failed: "
                                  + out.lstrip(b"w").decode(errors="replace")[-200:])
    return [struct.unpack("<q", out[1:])[0] for out in outs]


def _read_until(fd: int, n: int, deadline: float, timeout_s: float, pairs) -> bytes:
    """Up to ``n`` bytes of ``fd`` (fewer at its end of file); ControllerError at ``deadline``."""
    got = b""
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise ControllerError(f"the server's calibration took over {timeout_s:g} s "
                                  f"(on CPUs {pairs})")
        chunk = os.read(fd, n - len(got))
        if not chunk:
            break
        got += chunk
    return got


def _calibration_child(pair, rounds: int, go: int, others, out: int, in_child) -> None:
    """One pair's process of :func:`calibrate_forked` (never returns): "w" once warm, then its
    ns per hop (8 bytes), or what failed."""
    code = 1
    try:
        for fd in others:
            os.close(fd)
        if in_child is not None:
            in_child()
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

        def ready():
            os.write(out, b"w")
            os.read(go, 1)                  # end of file: every pair is warm
        ns = calibrate(rounds, cpus=(int(pair[0]), int(pair[1])), ready=ready)
        os.write(out, struct.pack("<q", ns))
        code = 0
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            os.write(out, f"{type(exc).__name__}: {exc}".encode()[-200:])
    finally:
        os._exit(code)


def _calibrate_started(pairs: list[list[int]], rounds: int) -> list[int]:
    """:func:`calibrate` on each pair of CPUs of ``pairs`` in a small process of its own
    (``python -m harmony.workload.serve``), their timed rounds started together (each says it is
    warm and waits for a line on its input); ns per hop, by pair. A pair that takes more than
    ``CALIBRATION_TIMEOUT_S`` is killed: ControllerError."""
    commands = [harmony_python("harmony.workload.serve", str(rounds), *map(str, pair),
                               site=False)
                for pair in pairs]
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for argv, env in commands]
    deadline = time.monotonic() + CALIBRATION_TIMEOUT_S
    try:
        warm = [bool(select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))[0])
                and p.stdout.readline().strip() == "warm" for p in procs]
        for p in procs:
            with contextlib.suppress(BrokenPipeError):
                p.stdin.write("go\n")
                p.stdin.flush()
        try:
            outs = [p.communicate(timeout=max(0.0, deadline - time.monotonic()))
                    for p in procs]                             # closes their input
        except subprocess.TimeoutExpired:
            raise ControllerError(f"the server's calibration took over {CALIBRATION_TIMEOUT_S} s "
                                  f"(on CPUs {pairs})") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for ok, p, (out, err) in zip(warm, procs, outs):
        if not ok or p.returncode != 0:
            raise ControllerError(f"the server's calibration failed: {err.strip()[-200:]}")
    return [int(out) for out, _ in outs]


def loops(p: dict, ncpus: int) -> int:
    """Event loops of the shape of parameters ``p``: one per CPU for thread-per-core, else one."""
    return ncpus if p["shape"] == "thread-per-core" else 1


def capacity(p: dict, ncpus: int) -> float:
    """Requests per second the shape of parameters ``p`` can serve on ``ncpus`` CPUs: the
    tightest of the CPUs' bound (``ncpus`` s of CPU time a second over the work plus one
    ``overhead_ns`` per task a request passes through: client, reader twice, each server), each
    single task's (the client's; the reader's; a loop's) and each pool's whose tasks sleep
    ``block_us`` (the ``server`` experiment's module docstring)."""
    ovh, work, block = p["overhead_ns"], p["work_us"] * 1e3, p["block_us"] * 1e3
    shape, s = p["shape"], p["stages"]
    touches = s + 3 if shape == "pool-per-stage" else 2     # client, (reader twice), each server
    bounds = [ncpus * 1e9 / (work + touches * ovh), 1e9 / ovh]
    if shape == "thread-per-connection":
        bounds.append(p["conns"] * 1e9 / (work + ovh + block))
    elif shape == "pool-per-stage":
        bounds += [1e9 / (2 * ovh), p["pool"] * 1e9 / (work / s + ovh + block)]
    else:
        bounds.append(loops(p, ncpus) * 1e9 / (work + ovh + block))
    return min(bounds)


def _check_free(addr: bytes) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(addr)
    except OSError as exc:
        raise ControllerError(f"the server's address @{addr[1:].decode()} is taken "
                              f"({exc.strerror}): another process holds it") from None
    finally:
        s.close()


def place(specs: list, run_dir, params: dict, cpus: list[int],
          scratch: str | None = None) -> tuple[list, dict]:
    """The server's tasks about to be captured into ``run_dir`` on ``cpus``, made ready where the
    capture runs (the host, or the guest agent in a VM: standard library only): each told where
    its records go and the pool's pipes, both in ``run_dir``'s ``raw/requests/`` or, given
    ``scratch``, in that directory (then moved into the run by :func:`keep_records` once the
    tasks are stopped), and the run's socket addresses (a fresh token); and what the run settles as
    it starts, returned to be recorded among its parameters: ``overhead_ns`` measured now
    (:func:`measure_overhead`) unless given, and the client's ``rate``, ``load`` x
    :func:`capacity`, unless given. ``specs``: TaskSpecs. ControllerError, before any task
    starts, if an address the run would listen on is taken (abstract AF_UNIX addresses with a
    fresh token: no port to run out of, but a process may hold one)."""
    settled = {}
    if not params["overhead_ns"]:
        settled["overhead_ns"] = measure_overhead(cpus)
    if not params["rate"]:
        settled["rate"] = round(params["load"] * capacity({**params, **settled}, len(cpus)), 1)
    records = scratch or os.path.join(run_dir, "raw", RECORDS_DIR)
    os.makedirs(records, exist_ok=True)
    token = f"{os.getpid():x}-{secrets.token_hex(4)}"
    parts = [json.loads(s.serve) for s in specs]
    for part in parts:
        what = _LISTENS.get(part["kind"], lambda part: None)(part)
        if what is not None:
            _check_free(address(token, what))
    stages = max([part.get("stages", 0) for part in parts])
    pipes = [os.path.join(records, f"stage{k}.fifo") for k in range(1, stages + 1)]
    if stages:
        pipes.append(os.path.join(records, "answers.fifo"))
    for path in pipes:
        if not os.path.exists(path):
            os.mkfifo(path, 0o600)
    common = {"records": records, "token": token, "pipes": pipes}
    rate = {"rate": settled["rate"]} if "rate" in settled else {}
    return [dataclasses.replace(s, serve=json.dumps({**part, **common,
                                                     **(rate if part["kind"] == "client" else {})}))
            for s, part in zip(specs, parts)], settled


def keep_records(scratch: str, run_dir) -> None:
    """The records the tasks wrote in ``scratch`` (:func:`place`), copied into ``run_dir``'s
    ``raw/requests/`` once they are stopped (each file written whole, then renamed), and
    ``scratch`` removed, pipes and all."""
    records = os.path.join(run_dir, "raw", RECORDS_DIR)
    os.makedirs(records, exist_ok=True)
    for name in sorted(os.listdir(scratch)):
        path = os.path.join(scratch, name)
        if os.path.isfile(path):
            tmp = os.path.join(records, name + ".tmp")
            shutil.copyfile(path, tmp)
            os.replace(tmp, os.path.join(records, name))
    shutil.rmtree(scratch)


def calibrate(rounds: int = 2000, warm: int = 200, cpus: tuple[int, int] | None = None,
              ready=None) -> int:
    """CPU time (ns) one task spends on a request besides its work, measured now: 64-byte
    messages sent by this thread to a forked echo process over an AF_UNIX stream socket pair and
    back, one at a time, each received whole, stamped and recorded (a write to /dev/null) by the
    echo. Both sides' thread CPU time over ``rounds`` round trips, after ``warm`` untimed ones
    (the first touches of pages the fork shares), over the rounds and the two tasks: the system
    calls, the wake-ups and the switches one hop costs. ``cpus``: this thread's CPU and the
    echo's (this process is pinned: run it in one of its own, ``python -m harmony.workload.serve``,
    whose fork shares little). Two CPUs, because a server's hops cross CPUs: on one CPU a hop is a
    switch (2.7-2.9 us on this host), across two a wake-up of another CPU (21-25 us), and an
    unpinned pair measures either, as the scheduler places it (bench/README.md). ``ready()``, if
    given, is called between the warm rounds and the timed ones (:func:`measure_overhead`)."""
    a, b = socket.socketpair()
    msg = MSG.pack(0, 0, 0, 0, 0, 0, 0, 0)
    if cpus is not None:
        os.sched_setaffinity(0, {cpus[0]})
    pid = os.fork()
    if pid == 0:                    # the echo: never returns
        try:
            if cpus is not None:
                os.sched_setaffinity(0, {cpus[1]})
            a.close()
            sink = os.open(os.devnull, os.O_WRONLY)
            n, start = 0, 0
            m = b.recv(MSG.size, socket.MSG_WAITALL)
            while len(m) == MSG.size:
                n += 1
                if n == warm + 1:
                    start = time.thread_time_ns()
                os.write(sink, REC.pack(0, 1, 0, mono(), mono(), 0))
                b.send(m)
                m = b.recv(MSG.size, socket.MSG_WAITALL)
            b.send(struct.pack("<q", time.thread_time_ns() - start))
        finally:
            os._exit(0)
    b.close()
    try:
        for k in range(warm + rounds):
            if k == warm:
                if ready is not None:
                    ready()
                start = time.thread_time_ns()
            a.send(msg)
            a.recv(MSG.size, socket.MSG_WAITALL)
        mine = time.thread_time_ns() - start
        a.shutdown(socket.SHUT_WR)
        echo = struct.unpack("<q", a.recv(8, socket.MSG_WAITALL))[0]
    finally:
        a.close()
        os.waitpid(pid, 0)
    return int((mine + echo) / rounds / 2)


def _warm_then_wait() -> None:
    print("warm", flush=True)
    sys.stdin.readline()


if __name__ == "__main__":      # the calibration, in a process of its own: prints overhead_ns
    # python -m harmony.workload.serve [ROUNDS [CPU CPU]]; in the fair class, as the servers run
    # by default. Once warm it prints "warm" and waits for a line on its input
    # (measure_overhead's start).
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    print(calibrate(int(sys.argv[1]) if len(sys.argv) > 1 else 2000,
                    cpus=(int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else None,
                    ready=_warm_then_wait))
