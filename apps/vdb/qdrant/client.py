"""What Qdrant's two clients share: distance names, knobs, argument checks and result padding.

Deferred indexing as in the study: ``indexing_threshold = 0`` while uploading, then ``build_index`` sets the
real threshold and waits until nothing is left to optimise. Point ids are the int64 row ids (Qdrant ids are
u64), so a retried batch overwrites the same points.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from apps.vdb.base import Client, CollectionSpec, DatabaseError, Endpoints, SearchResult
from apps.vdb.qdrant.settings import QdrantSettings
from apps.vdb.qdrant.storage import plan

DISTANCE = {"cosine": "Cosine", "ip": "Dot", "l2": "Euclid"}  # names shared by edge and qdrant-client


def knob(settings: QdrantSettings, spec: CollectionSpec, name: str) -> Any:
    """A segment/index knob: ``spec.options`` overrides the database settings."""
    return spec.options.get(name, getattr(settings, name))


class QdrantClientBase(Client):
    """Shared checks and bookkeeping; subclasses talk to edge or to qdrant-client."""

    def __init__(self, settings: QdrantSettings, endpoints: Endpoints) -> None:
        self.settings, self.endpoints = settings, endpoints
        self.spec: CollectionSpec | None = None

    def _bound(self) -> CollectionSpec:
        if self.spec is None:
            raise DatabaseError(
                "qdrant: call create_collection first (it attaches to an existing collection)"
            )
        return self.spec

    def _check_spec(self, spec: CollectionSpec) -> None:
        if spec.index_type not in ("hnsw", "flat"):
            raise DatabaseError(f"qdrant supports index_type hnsw or flat, not {spec.index_type!r}")
        plan(spec)  # DatabaseError for a quantisation Qdrant cannot build

    def _check_existing(self, spec: CollectionSpec, dim: int, distance: str) -> None:
        if dim != spec.dim or distance != DISTANCE[spec.metric]:
            raise DatabaseError(
                f"qdrant collection {spec.name!r} exists with dimension {dim} and distance {distance}, but "
                f"dimension {spec.dim} and distance {DISTANCE[spec.metric]} were requested "
                "(use another name or recreate it)"
            )

    def _check_batch(self, what: str, array: np.ndarray) -> np.ndarray:
        dim = self._bound().dim
        array = np.asarray(array, dtype=np.float32)
        if array.ndim != 2 or array.shape[1] != dim:
            raise DatabaseError(f"qdrant: {what} have shape {array.shape}, collection dimension is {dim}")
        return array

    @staticmethod
    def _check_ids(ids: np.ndarray, n: int) -> list[int]:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.shape != (n,) or (ids < 0).any():  # Qdrant ids are u64; local mode accepts -1 silently
            raise ValueError(f"qdrant: need {n} non-negative row ids, got shape {ids.shape}")
        return ids.tolist()

    @staticmethod
    def _result(hits: list[list[tuple[int, float]]], k: int) -> SearchResult:
        ids = np.full((len(hits), k), -1, dtype=np.int64)
        scores = np.full((len(hits), k), np.nan, dtype=np.float32)
        for row, points in enumerate(hits):
            for col, (pid, score) in enumerate(points[:k]):
                ids[row, col], scores[row, col] = pid, score
        return SearchResult(ids=ids, scores=scores)

    def wait_searchable(self, expected: int, timeout: float) -> None:
        """Poll the exact count until ``expected`` points are visible."""
        missing = "qdrant: only {seen} of {expected} points visible after {timeout:.0f}s"
        self.wait_for_count(expected, timeout, self.settings.poll_s, missing)
