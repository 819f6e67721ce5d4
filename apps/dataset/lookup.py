"""Vectors by id: the base vectors a result needs, gathered from the dataset parts, and the query vectors.

* :class:`VectorLookup`: vectors addressed by int64 id (sorted, unique).
* :func:`fetch_vectors`: the base vectors of given ids, gathered in one streaming pass over the dataset
  parts keeping only the requested rows, so memory follows the result size, not the dataset size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from apps.dataset.layout import arrow_to_vectors, iter_vectors
from core.store import read_store_table


@dataclass(frozen=True)
class VectorLookup:
    """Vectors addressed by int64 id: ``ids`` sorted and unique, ``vectors[i]`` belongs to ``ids[i]``."""

    ids: np.ndarray
    vectors: np.ndarray

    @classmethod
    def from_arrays(cls, ids: Any, vectors: Any) -> VectorLookup:
        """From parallel ids (n,) and vectors (n, dim); a repeated id keeps its first vector."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(vectors) != len(ids):
            raise ValueError(f"ids {ids.shape} and vectors {vectors.shape} do not match")
        unique, first = np.unique(ids, return_index=True)
        return cls(unique, np.ascontiguousarray(vectors[first]))

    @classmethod
    def from_mapping(cls, mapping: Mapping[int, Any]) -> VectorLookup:
        """From a dict id -> vector."""
        if not mapping:
            return cls(np.zeros(0, np.int64), np.zeros((0, 0), np.float32))
        ids = np.fromiter((int(i) for i in mapping), dtype=np.int64, count=len(mapping))
        return cls.from_arrays(ids, np.stack([np.asarray(v, np.float32) for v in mapping.values()]))

    @classmethod
    def from_table(
        cls, table: pa.Table, id_column: str = "id", vector_column: str = "embedding"
    ) -> VectorLookup:
        """From a table with an id column and a fixed_size_list vector column (queries.parquet)."""
        return cls.from_arrays(
            table.column(id_column).to_numpy(), arrow_to_vectors(table.column(vector_column))
        )

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1]) if self.vectors.ndim == 2 else 0

    def positions(self, ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """(row positions, found mask) of ``ids`` (any shape); positions of unknown ids are 0."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(self.ids) == 0:
            return np.zeros(ids.shape, np.int64), np.zeros(ids.shape, bool)
        pos = np.searchsorted(self.ids, ids).clip(max=len(self.ids) - 1)
        found = self.ids[pos] == ids
        return np.where(found, pos, 0), found

    def missing(self, ids: Any) -> np.ndarray:
        """The ids (unique, sorted) that this lookup does not hold."""
        ids = np.unique(np.asarray(ids, dtype=np.int64))
        return ids[~self.positions(ids)[1]]

    def get(self, ids: Any) -> np.ndarray:
        """Vectors of ``ids`` (n,) -> (n, dim); KeyError naming the first unknown id."""
        pos, found = self.positions(np.asarray(ids, dtype=np.int64).reshape(-1))
        if not found.all():
            raise KeyError(f"no vector for id {int(np.asarray(ids).reshape(-1)[~found][0])}")
        return self.vectors[pos]


VectorSource = VectorLookup | Mapping[int, Any] | tuple[Any, Any] | pa.Table


def as_lookup(source: VectorSource) -> VectorLookup:
    """A :class:`VectorLookup` from a lookup, a dict id -> vector, an (ids, vectors) pair in either order,
    or a table with ``id`` and ``embedding`` columns."""
    if isinstance(source, VectorLookup):
        return source
    if isinstance(source, pa.Table):
        return VectorLookup.from_table(source)
    if isinstance(source, Mapping):
        return VectorLookup.from_mapping(source)
    if isinstance(source, tuple | list) and len(source) == 2:
        a, b = (np.asarray(x) for x in source)
        return VectorLookup.from_arrays(a, b) if b.ndim == 2 else VectorLookup.from_arrays(b, a)
    raise TypeError(f"cannot use {type(source).__name__} as vectors by id")


def fetch_vectors(dataset_dir: str | Path, ids: Any, batch_rows: int = 8192) -> VectorLookup:
    """The base vectors of ``ids``, gathered in one streaming pass over the dataset parts.

    Only the requested rows are kept, each written once into its place (memory follows ``len(ids)``, not
    the dataset), and the pass stops when every one was found. Ids absent from the dataset (and -1 pads)
    are simply not in the result: check with ``lookup.missing(ids)``. Ids are unique in a dataset; were
    one repeated, the vector of its first batch would be kept.
    """
    wanted = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
    wanted = wanted[wanted >= 0]
    vectors: np.ndarray | None = None
    found = np.zeros(len(wanted), dtype=bool)
    dim = 0
    for batch_ids, batch in iter_vectors(Path(dataset_dir), batch_rows=batch_rows):
        dim = batch.shape[1]
        if len(wanted) == 0:
            break
        if vectors is None:
            vectors = np.empty((len(wanted), dim), dtype=np.float32)
        slot = np.searchsorted(wanted, batch_ids).clip(max=len(wanted) - 1)
        keep = (wanted[slot] == batch_ids) & ~found[slot]
        if keep.any():
            vectors[slot[keep]] = batch[keep]
            found[slot[keep]] = True
            if found.all():
                break
    if vectors is None or not found.any():
        return VectorLookup(np.zeros(0, np.int64), np.zeros((0, dim), np.float32))
    if found.all():
        return VectorLookup(wanted, vectors)
    return VectorLookup(wanted[found], vectors[found])


def read_query_vectors(queries_file: str | Path) -> VectorLookup:
    """Query vectors by id from ``queries.parquet`` (columns ``id``, ``embedding``)."""
    return VectorLookup.from_table(read_store_table(queries_file, columns=["id", "embedding"]))


def read_groundtruth(path: str | Path) -> pa.Table:
    """``groundtruth.parquet`` (query_id, neighbors, distances)."""
    return read_store_table(path, columns=["query_id", "neighbors", "distances"])
