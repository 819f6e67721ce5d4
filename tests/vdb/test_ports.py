"""Free ports are chosen below the kernel's ephemeral range, so no outgoing connection can take one."""

from __future__ import annotations

import socket

import pytest

from apps.vdb import process
from apps.vdb.base import DatabaseError
from apps.vdb.process import ephemeral_floor, free_port_block, free_ports


def test_ports_lie_below_the_ephemeral_range_and_can_be_bound() -> None:
    base = free_port_block(20, host="0.0.0.0")
    ports = free_ports(5)
    assert base >= process.FIRST_PORT and base + 20 <= ephemeral_floor()
    assert all(process.FIRST_PORT <= p < ephemeral_floor() for p in ports) and len(set(ports)) == 5
    for port in [*range(base, base + 20), *ports]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_taken_port_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    base = free_port_block(4)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        # Only base .. base + 3 can be chosen; base + 1 is taken.
        monkeypatch.setattr(process, "FIRST_PORT", base)
        monkeypatch.setattr(process, "ephemeral_floor", lambda: base + 4)
        for _ in range(20):
            assert sorted(free_ports(3)) == [base, base + 2, base + 3]
        assert free_port_block(2, attempts=50) == base + 2
        with pytest.raises(DatabaseError, match="no 3 consecutive free ports"):
            free_port_block(3, attempts=50)
