"""Parsl's start and end, made safe for a run that a signal stops.

:func:`load_parsl` starts Parsl's DataFlowKernel with the terminal's Ctrl-C held off its interchange,
records the interchanges (a killed driver's next run stops them) and guards each HTEX task pipe;
:func:`shut_down_parsl` ends it, bounded, whatever state the interchanges are in.

Three hazards of parsl 2026.10.26's HighThroughputExecutor are handled here, all of them met when SIGTERM
reaches a run's whole process group (``scancel``, ``kill -- -PGID``), the interchange included:

- its cleanup asks an exited interchange for its managers and waits for ever (Parsl issue #2755);
- a task launched after the interchange exited blocks for ever in its send (a ZeroMQ DEALER socket with
  no peer), and the cleanup's closing of that socket under the blocked thread aborts the whole driver
  (libzmq: ``Assertion failed: pfd.revents & POLLIN (src/signaler.cpp:238)``, exit -6);
- nothing serialises the threads that use that socket ("used in a thread unsafe manner", its comment
  says): the DFK's one launch thread sends while the cleanup thread closes it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from core.lifetime import ctrl_c_held, record_group

log = logging.getLogger(__name__)


def load_parsl(config: Any) -> Any:
    """``parsl.load(config)``, its interchanges recorded and its task pipes guarded; returns the DFK."""
    import parsl
    from parsl.executors import HighThroughputExecutor

    with ctrl_c_held():  # the interchange and the first worker pools ignore the terminal's Ctrl-C
        dfk = parsl.load(config)
    record_interchanges(dfk)
    for executor in dfk.executors.values():
        if isinstance(executor, HighThroughputExecutor):
            guard_task_pipe(executor.outgoing_q)  # an AttributeError if Parsl renames it: not skipped
    return dfk


SEND_POLL_MS = 100  # how soon a send waiting for a peer notices the pipe is closing


class PipeClosedError(RuntimeError):
    """A task reached the executor after its shutdown began: it is not sent (the run is ending)."""


def guard_task_pipe(pipe: Any) -> None:
    """Make an HTEX task pipe (``zmq_pipes.TasksOutgoing``) safe to close while a thread sends on it.

    Sends take one lock, wait for the socket to be writable in short polls and send without blocking (a
    peer that left between the poll and the send makes it poll again), so none waits inside ZeroMQ;
    closing first stops new and waiting sends (they raise :class:`PipeClosedError`, which fails their
    task), then closes the socket once no thread is in it.
    """
    lock, closing = threading.Lock(), threading.Event()
    socket, close = pipe.zmq_socket, pipe.close

    def put(message: Any) -> None:
        if not closing.is_set():
            with lock:
                while not closing.is_set():
                    if not socket.poll(SEND_POLL_MS, zmq.POLLOUT):
                        continue
                    try:  # never blocking: the interchange may have gone since the poll said writable
                        socket.send_pyobj(message, flags=zmq.NOBLOCK)
                        return
                    except zmq.Again:
                        continue
        raise PipeClosedError("the executor is shutting down: the task was not sent")

    def close_when_idle() -> None:
        closing.set()
        with lock:
            close()

    pipe.put, pipe.close = put, close_when_idle


def interchanges(dfk: Any) -> dict[str, Any]:
    """The interchange process (``subprocess.Popen``) of each executor that started one, by label."""
    procs = {label: getattr(e, "interchange_proc", None) for label, e in dfk.executors.items()}
    return {label: proc for label, proc in procs.items() if proc is not None}


def record_interchanges(dfk: Any) -> None:
    """Record each HTEX interchange this run started, by pid and start time.

    The interchange renames itself (setproctitle), which overwrites what /proc shows of its environment,
    so the run id it inherited cannot find it: without a record, a driver killed outright leaves it
    running, and the next run could not tell it from anyone else's.
    """
    for label, proc in interchanges(dfk).items():
        if proc.pid:
            record_group(f"parsl interchange {label}", proc.pid, None)


# Parsl's cleanup first closes its job-status poller, which asks the interchange for its managers to
# scale in, and can wait for ever on an interchange that has exited (parsl 2026.10.26:
# HighThroughputExecutor.connected_managers -> CommandClient.run without a timeout): a SIGTERM to the whole
# process group (scancel, kill -- -PGID) reaches the interchange as well as the driver. A command sent
# after the interchange exited is answered for it (below); one sent before still waits, so once an
# interchange has exited the cleanup gets what HTEX.shutdown gives an interchange to end; after that the
# driver goes on (the cleanup thread finishes, if it can, while the run's own teardown goes on).
INTERCHANGE_EXITED_GRACE_S = 10.0
CLEANUP_LIMIT_S = 300.0  # any other hang: the run still ends
INTERCHANGE_SETTLE_S = 1.0  # an interchange signalled with the driver exits within ~0.1 s
# What an exited interchange is taken to answer (Parsl issue #2755): no managers, so the scale-in at
# cleanup goes on to cancel every block through its provider at once, instead of waiting for ever.
EXITED_INTERCHANGE_REPLIES: dict[str, Callable[[], Any]] = {
    "MANAGERS": list,
    "CONNECTED_BLOCKS": list,
    "MANAGERS_PACKAGES": dict,
}


def answer_for_exited_interchanges(dfk: Any, settle_s: float = 0.0) -> None:
    """Have each HTEX executor's command client answer for its interchange once that has exited
    (:data:`EXITED_INTERCHANGE_REPLIES`; None to any other command) instead of waiting on it.

    A run stopped by SIGTERM waits up to ``settle_s`` for its interchanges to exit first: a SIGTERM to the
    process group reaches them too, but they take a moment to exit, and a command sent to one before it
    has still waits for ever (:func:`shut_down_parsl`'s grace bounds that)."""
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and any(p.poll() is None for p in interchanges(dfk).values()):
        time.sleep(0.02)
    for executor in dfk.executors.values():
        proc, client = getattr(executor, "interchange_proc", None), getattr(executor, "command_client", None)
        if proc is None or client is None:
            continue
        client.run = _answering_when_exited(client.run, proc)


def _answering_when_exited(ask: Callable[..., Any], proc: Any) -> Callable[..., Any]:
    """``ask`` (a command client's ``run``) while ``proc`` (its interchange) runs; its answer after."""

    def run(message: Any, *args: Any, **kwargs: Any) -> Any:
        if proc.poll() is None:
            return ask(message, *args, **kwargs)
        command = message[0] if isinstance(message, list) else message
        return EXITED_INTERCHANGE_REPLIES.get(command, lambda: None)()

    return run


def shut_down_parsl(dfk: Any, terminated: bool = False) -> None:
    """``dfk.cleanup()``, bounded: an exited interchange is answered for (its blocks are cancelled
    through their providers at once); the cleanup is not waited for longer than
    ``INTERCHANGE_EXITED_GRACE_S`` after an interchange exited, nor than ``CLEANUP_LIMIT_S`` in all;
    then every interchange still running is killed, and the worker pools' watchdogs end the pools as the
    driver exits. ``terminated``: the run is ending on SIGTERM, which may have reached the interchanges
    too (they ignore a terminal's Ctrl-C)."""
    answer_for_exited_interchanges(dfk, INTERCHANGE_SETTLE_S if terminated else 0.0)
    cleanup = threading.Thread(target=dfk.cleanup, name="parsl-cleanup", daemon=True)
    cleanup.start()
    started, exited_at = time.monotonic(), None
    while cleanup.is_alive():
        cleanup.join(0.2)
        now = time.monotonic()
        if exited_at is None and any(p.poll() is not None for p in interchanges(dfk).values()):
            exited_at = now
        if (exited_at is not None and now - exited_at > INTERCHANGE_EXITED_GRACE_S) or (
            now - started > CLEANUP_LIMIT_S
        ):
            break
    if cleanup.is_alive():
        log.warning(
            "Parsl's cleanup had not ended after %.0f s (an interchange exited under it); "
            "stopping the interchanges and going on",
            time.monotonic() - started,
        )
        for proc in interchanges(dfk).values():
            if proc.poll() is None:
                proc.kill()
