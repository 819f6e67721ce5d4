"""What a database's ``ranks`` module plans: a :class:`RankPlan`, one :class:`RankSpec` per server."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RankSpec:
    """One server process of a cluster, fully decided at plan time except for run-time addresses.

    Strings may reference ``${VDB_ADDR}`` (this rank's address) and ``${VDB_RANK0_ADDR}`` (rank 0's,
    read from the registry): the rank script substitutes both before starting the container.
    """

    rank: int
    role: str
    ports: dict[str, int]
    client_port: str  # the ports key clients connect to
    image: str
    argv: list[str]
    env: dict[str, str]
    binds: list[tuple[str, str]]  # (host path, container path)
    data_dir: str
    ready_url: str  # polled until it answers 2xx: 127.0.0.1 or ${VDB_ADDR}, wherever the server listens
    up_port: str | None = None  # a port whose opening lets others join before ready (Weaviate gossip)
    waits_for_rank0: bool = False
    node_slot: int = 0
    local_index: int = 0
    cores: list[int] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # config files (name -> text) bound into it
    apptainer_flags: list[str] = field(default_factory=list)
    workdir: str | None = None  # runtime native: the directory the server starts in
    # Endpoint.extra key -> a file under the rank's directory (shared file system) its clients read
    client_files: dict[str, str] = field(default_factory=dict)


@dataclass
class RankPlan:
    """What a database's ``ranks`` module plans: its ranks, those clients connect to, a shared directory."""

    ranks: list[RankSpec]
    entry_ranks: list[int]  # preferred first
    shared_data: str | None = None  # Milvus distributed: the directory every rank shares
    native: bool = False  # runtime native: the ranks are host commands already (no image to translate)
