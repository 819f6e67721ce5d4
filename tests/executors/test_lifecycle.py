"""Parsl's start and end under signals (executors/lifecycle.py): a task pipe closed under a send, an
exited interchange's cleanup.

The pipe tests run a real HTEX task pipe (``zmq_pipes.TasksOutgoing``) in a child process: unguarded,
closing it under a send that waits for a peer hangs or aborts the process (libzmq's ``signaler.cpp``
assertion).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

# A launch thread sends while the run's cleanup closes the pipe; the interchange never connected, or
# connected and then died (the run's SIGTERM reached it) while tasks were being sent.
RACE = """
import json, sys, threading, time
import zmq
from parsl.executors.high_throughput.zmq_pipes import TasksOutgoing
from executors.lifecycle import PipeClosedError, guard_task_pipe

def race(peer: str, delay: float) -> list[str]:
    pipe = TasksOutgoing("127.0.0.1", (54000, 55000))
    guard_task_pipe(pipe)
    interchange = None
    if peer != "none":  # the interchange's end: a DEALER connected to the pipe's port
        interchange = zmq.Context.instance().socket(zmq.DEALER)
        interchange.connect(f"tcp://127.0.0.1:{pipe.port}")
    outcome: list[str] = []
    sent = [0]

    def launch(task: int) -> None:
        try:
            while True:
                pipe.put({"task_id": task})
                sent[0] += 1
                if peer != "dies":
                    break
            outcome.append("sent")
        except PipeClosedError:
            outcome.append("refused")

    threads = [threading.Thread(target=launch, args=(task,), daemon=True) for task in range(2)]
    for thread in threads:
        thread.start()
    if peer == "lives":
        got = sorted(interchange.recv_pyobj()["task_id"] for _ in threads)
        outcome.append(f"received {got}")
    if peer == "dies":
        while sent[0] < 50:  # tasks flow to the interchange ...
            time.sleep(0.001)
        interchange.close(0)  # ... when it dies under them
    time.sleep(delay)
    closer = threading.Thread(target=pipe.close, daemon=True)
    closer.start()
    for thread in [closer, *threads]:
        thread.join(5)
    outcome.append("stuck" if any(t.is_alive() for t in [closer, *threads]) else "ended")
    if interchange is not None and peer == "lives":
        interchange.close(0)
    return outcome

rounds = int(sys.argv[1])
print(json.dumps({
    "none": [race("none", 0.002 * (i % 5)) for i in range(rounds)],
    "dies": [race("dies", 0.01 * (i % 6)) for i in range(rounds)],
    "lives": race("lives", 0.0),
}))
"""


def run_race(rounds: int) -> dict[str, list]:
    proc = subprocess.run(
        [sys.executable, "-c", RACE, str(rounds)], cwd=REPO, capture_output=True, text=True, timeout=60
    )  # unguarded, a round hangs (the timeout) or aborts the process (-6)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_a_task_pipe_closed_under_a_waiting_send_refuses_the_task_instead_of_aborting() -> None:
    """Every round ends: with no interchange, or one that died while tasks flowed to it, the sends that
    wait are refused when the pipe closes (their tasks fail), and the process goes on. With the
    interchange connected, two threads' tasks both arrive."""
    outcome = run_race(rounds=20)
    assert outcome["none"] == [["refused", "refused", "ended"]] * 20
    assert outcome["dies"] == [["refused", "refused", "ended"]] * 20
    assert sorted(outcome["lives"]) == ["ended", "received [0, 1]", "sent", "sent"]


def test_load_parsl_guards_the_task_pipe_and_tasks_still_run(tmp_path: Path) -> None:
    """On a real local HTEX: the pipe is guarded, a task runs through it, and the end is bounded."""
    from parsl import python_app

    from executors.lifecycle import load_parsl, shut_down_parsl
    from executors.platforms import parsl_config_for
    from pipeline.config.model import LocalExecutorConfig

    dfk = load_parsl(parsl_config_for(LocalExecutorConfig(workers=1), tmp_path / "parsl"))
    try:
        pipes = [e.outgoing_q for e in dfk.executors.values() if hasattr(e, "outgoing_q")]
        assert pipes and all(p.close.__name__ == "close_when_idle" for p in pipes)
        dumps = python_app(json.dumps, data_flow_kernel=dfk, executors=["workers"])  # importable there
        assert dumps({"task": 1}).result(timeout=120) == '{"task": 1}'
    finally:
        shut_down_parsl(dfk)


def test_parsl_cleanup_is_answered_for_an_exited_interchange_and_goes_on() -> None:
    """Parsl issue #2755: the cleanup's scale-in asks the interchange for its managers and, once the
    interchange has exited (a SIGTERM to the process group reaches it too), waits for ever. The command
    client answers for it instead (no managers), so the cleanup goes on to cancel the blocks through their
    provider; a live interchange is still asked."""
    import threading
    from types import SimpleNamespace

    from executors.lifecycle import shut_down_parsl

    hang = threading.Event()

    def ask(message: object, *args: object, **kwargs: object) -> object:
        hang.wait()  # what a REQ socket to an exited interchange does: wait for ever
        return "asked"

    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    live_client = SimpleNamespace(run=lambda message, *a, **k: f"asked {message}")
    executors = {
        "cpu": SimpleNamespace(interchange_proc=exited, command_client=SimpleNamespace(run=ask)),
        "gpu": SimpleNamespace(interchange_proc=alive, command_client=live_client),
    }
    answers: dict[str, object] = {}

    def cleanup() -> None:  # as the scale-in asks, then holds a manager
        for label, executor in executors.items():
            answers[label] = executor.command_client.run("MANAGERS")
            answers[f"{label} hold"] = executor.command_client.run(["HOLD_MANAGER", b"m1"])
        answers["ended"] = True

    try:
        shut_down_parsl(SimpleNamespace(executors=executors, cleanup=cleanup))  # stuck: returns at its grace
        assert answers == {
            "cpu": [],
            "cpu hold": None,
            "gpu": "asked MANAGERS",
            "gpu hold": "asked ['HOLD_MANAGER', b'm1']",
            "ended": True,
        }
    finally:
        hang.set()
        alive.kill()
        alive.wait()
