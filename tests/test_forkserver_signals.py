"""A Ctrl-C (or SIGTERM) that lands inside a request to the fork server leaves the next request
answered, at once and with its own reply: each reply names its request's id. Counted instead, a
request stopped between its send and its count (or a reply between its read and its count) left
the next request waiting its whole timeout (60 s at a workload's stop) for a reply that never
came: a suite stopped by Ctrl-C as a run began took a minute to exit (a kernel test, 1 time in
3)."""

import os
import signal

import pytest

from harmony.core import stops
from harmony.core.errors import ForkServerError
from harmony.workload import forkserver

#: a request the server answers at once: stop a workload it never had (no worker to kill)
NOTHING = {"op": "stop", "wid": -1}


@pytest.fixture
def server():
    s = forkserver.ForkServer()
    yield s
    s.close()


def _interrupted_at(monkeypatch, name: str, before: bool):
    """Replace forkserver.NAME by the same call with SIGINT sent to this process just before it
    (``before``) or just after it, where Python raises it at once."""
    real = getattr(forkserver, name)

    def call(*args, **kw):
        if before:
            os.kill(os.getpid(), signal.SIGINT)
        out = real(*args, **kw)
        if not before:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(forkserver, name, call)


@pytest.mark.parametrize("name,before", [("_send", True), ("_recv", False)])
def test_a_ctrl_c_inside_a_request_leaves_the_next_one_answered(server, monkeypatch, name, before):
    # Python's handler, or the command's once harmony.cli was imported here: both raise it
    assert signal.getsignal(signal.SIGINT) in (signal.default_int_handler, stops.raise_stop)
    _interrupted_at(monkeypatch, name, before)
    with pytest.raises(KeyboardInterrupt):
        server.request(NOTHING, timeout_s=5)
    monkeypatch.undo()
    # the next request gets its own reply, at once: not a timeout, not the first one's reply
    with pytest.raises(ForkServerError, match="KeyError"):     # the first's was {"exited": []}
        server.request({"op": "poll", "wid": -1}, timeout_s=5)
    assert server.alive()


def test_a_ctrl_c_while_the_reply_is_awaited_is_raised_there(server, monkeypatch):
    """Waiting for a reply can still be stopped."""
    import threading

    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    monkeypatch.setattr(forkserver, "_send", lambda *a, **k: None)   # a reply that never comes
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        server.request(NOTHING, timeout_s=30)
    timer.join()
