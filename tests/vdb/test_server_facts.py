"""Server facts read back from a running process: affinity, threads, listeners, wildcard warning."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from apps.vdb.server_facts import observe_servers, read_server_facts

# A "server" that listens on loopback and, in a child process, on every interface, then waits.
SERVER = """
import socket, subprocess, sys, time
wild = sys.argv[1] == "wild"
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
child = None
if wild:
    child = subprocess.Popen([sys.executable, "-c",
        "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); "
        "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def server(request) -> Iterator[subprocess.Popen]:
    """The fake server in its own process group, pinned to CPU 0; killed with its child afterwards."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, request.param],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {0}),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
        time.sleep(0.1)


@pytest.mark.parametrize("server", ["loopback"], indirect=True)
def test_loopback_server_facts(server: subprocess.Popen, caplog: pytest.LogCaptureFixture) -> None:
    facts = read_server_facts("fake", server.pid)
    assert facts.cpus_allowed == [0]  # the affinity the kernel applied, read back
    assert facts.threads >= 1
    assert len(facts.listeners) == 1 and facts.listeners[0].startswith("127.0.0.1:")
    assert facts.wildcard == []
    with caplog.at_level(logging.WARNING):
        assert observe_servers("fakedb", {"fake": server.pid}) == [facts]
    assert not caplog.records


@pytest.mark.parametrize("server", ["wild"], indirect=True)
def test_wildcard_listener_of_a_child_is_named_in_a_warning(
    server: subprocess.Popen, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        (facts,) = observe_servers("fakedb", {"fake": server.pid}, why_wildcard="no setting in 1.0")
    assert len(facts.listeners) == 2
    assert len(facts.wildcard) == 1 and facts.wildcard[0].startswith("0.0.0.0:")
    message = caplog.records[0].getMessage()
    assert "fakedb" in message and facts.wildcard[0] in message and "no setting in 1.0" in message


def test_a_server_that_exited_is_left_out() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    assert gone.wait() == 0
    assert observe_servers("fakedb", {"gone": gone.pid}) == []
