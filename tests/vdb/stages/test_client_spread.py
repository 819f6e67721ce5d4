"""Clients are spread over a database's entry ranks: client i talks to nodes[i % len(nodes)]."""

from __future__ import annotations

import numpy as np
import pytest

from apps.vdb.base import CollectionSpec, DatabaseError, Endpoint, Endpoints
from apps.vdb.pool import ClientPool, client
from apps.vdb.qdrant.settings import QdrantSettings
from apps.vdb.records import DatabaseTarget
from apps.vdb.stages.query_sweep import run_share

RANKS = [0, 4, 8]  # entry ranks of a cluster: e.g. the proxies of a Milvus layout


def three_nodes() -> Endpoints:
    """Three entry ranks; each is qdrant-client's local mode in memory (a stand-in server per process)."""
    nodes = [Endpoint(rank=r, host=f"node{r}", port=6333, extra={"location": ":memory:"}) for r in RANKS]
    return Endpoints(database="qdrant", nodes=nodes, data_dir="")


def test_entry_deals_clients_round_robin_over_the_nodes() -> None:
    endpoints = three_nodes()
    assert [endpoints.entry(i).rank for i in range(7)] == [0, 4, 8, 0, 4, 8, 0]
    with pytest.raises(DatabaseError, match="name no server"):
        Endpoints(database="milvus", nodes=[], data_dir="").entry(0)


def _rank() -> int:
    return client().rank


@pytest.fixture(scope="module")
def target() -> DatabaseTarget:
    settings = QdrantSettings(mode="server", url=":memory:")
    return DatabaseTarget(settings=settings, endpoints=three_nodes(), collection=CollectionSpec(dim=4))


def test_a_worker_s_clients_continue_the_numbering_of_the_workers_before_it(target) -> None:
    """Insert worker w with 2 clients each numbers its clients 2w, 2w+1: worker 1 -> nodes 2 and 0."""
    with ClientPool(2, target, first_client=1 * 2) as pool:
        ranks = [pool.submit(_rank, client_index=c).result() for c in range(pool.size)]
        again = [pool.submit(_rank).result() for _ in range(2 * pool.size)]  # in turn: the same clients
    assert ranks == [RANKS[2], RANKS[0]]
    assert again == ranks * 2


def test_query_rows_record_the_rank_each_client_used(target) -> None:
    vectors = np.eye(4, dtype=np.float32)
    ids = np.arange(4)
    with ClientPool(3, target) as pool:
        shares = [
            pool.submit(run_share, ids, vectors, 2, None, 2, 0, i, client_index=i).result() for i in range(3)
        ]
    for i, (rows, _, stall) in enumerate(shares):
        assert stall is None
        assert rows["client"] == [i] * 4 and rows["rank"] == [RANKS[i]] * 4
