"""SQL of the pgvector client, built with ``psycopg.sql`` (identifiers quoted, values as literals or
parameters), and pgvector's binary formats (``COPY ... WITH (FORMAT BINARY)`` rows, ``vector`` values).

Index types map to access methods: ``hnsw`` -> pgvector ``hnsw`` (m, ef_construction), ``ivf_flat`` ->
pgvector ``ivfflat`` (lists) or, with the vectorchord extension, VectorChord's ``vchordrq`` (IVF with
RaBitQ-quantised vectors and reranking), ``flat`` -> no index (an exact scan).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from apps.vdb.base import CollectionSpec, DatabaseError

# metric -> (distance operator, operator class suffix); the operator's value is the score reported:
# cosine distance, negative inner product, L2 distance (smaller is nearer for all three).
OPERATORS = {"cosine": ("<=>", "cosine_ops"), "ip": ("<#>", "ip_ops"), "l2": ("<->", "l2_ops")}
# index type -> the search GUC that its ``ef`` knob sets (apps.vdb.base.SEARCH_KNOB), per extension
SEARCH_GUC = {
    ("hnsw", "pgvector"): "hnsw.ef_search",
    ("hnsw", "vectorchord"): "hnsw.ef_search",
    ("ivf_flat", "pgvector"): "ivfflat.probes",
    ("ivf_flat", "vectorchord"): "vchordrq.probes",
}
PGCOPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
PGCOPY_TRAILER = struct.pack(">h", -1)


def index_method(spec: CollectionSpec, extension: str) -> str | None:
    """The access method of ``spec.index_type`` (None: flat, no index)."""
    if spec.index_type == "flat":
        return None
    if spec.index_type == "hnsw":
        return "hnsw"
    if spec.index_type == "ivf_flat":
        return "vchordrq" if extension == "vectorchord" else "ivfflat"
    raise DatabaseError(f"pgvector builds index_type hnsw, ivf_flat or flat, not {spec.index_type!r}")


def create_table(spec: CollectionSpec) -> Any:
    """``CREATE TABLE IF NOT EXISTS <name> (id bigint primary key, embedding vector(dim))``."""
    from psycopg import sql

    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (id bigint PRIMARY KEY, embedding vector({}) NOT NULL)"
    ).format(sql.Identifier(spec.name), sql.Literal(int(spec.dim)))


def create_index(spec: CollectionSpec, extension: str) -> Any:
    """``CREATE INDEX IF NOT EXISTS`` with the index type's parameters (None for flat)."""
    from psycopg import sql

    method = index_method(spec, extension)
    if method is None:
        return None
    opclass = "vector_" + OPERATORS[spec.metric][1]
    if method == "hnsw":
        params = sql.SQL("m = {}, ef_construction = {}").format(
            sql.Literal(int(spec.hnsw_m)), sql.Literal(int(spec.ef_construction))
        )
    elif method == "ivfflat":
        params = sql.SQL("lists = {}").format(sql.Literal(int(spec.ivf_nlist)))
    else:  # vchordrq: its options are TOML text (VectorChord's advice: residuals for L2, else spherical)
        l2 = spec.metric == "l2"
        toml = (
            f"residual_quantization = {str(l2).lower()}\n[build.internal]\nlists = [{int(spec.ivf_nlist)}]\n"
            f"spherical_centroids = {str(not l2).lower()}\n"
        )
        params = sql.SQL("options = {}").format(sql.Literal(toml))
    return sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING {} (embedding {}) WITH ({})").format(
        sql.Identifier(index_name(spec)),
        sql.Identifier(spec.name),
        sql.SQL(method),
        sql.SQL(opclass),
        params,
    )


def index_name(spec: CollectionSpec) -> str:
    """The index's name: ``<table>_embedding_idx`` (cut to PostgreSQL's 63-byte identifiers)."""
    return f"{spec.name[:49]}_embedding_idx"


def search(spec: CollectionSpec, k: int) -> Any:
    """Every query of a batch in one statement: the queries (a ``vector[]`` parameter) unnested with their
    position, each joined laterally to its own ``ORDER BY embedding <op> q LIMIT k`` (an index scan)."""
    from psycopg import sql

    op = sql.SQL(OPERATORS[spec.metric][0])
    return sql.SQL(
        "SELECT q.i, r.id, r.d FROM unnest(%b::vector[]) WITH ORDINALITY AS q(v, i) "
        "CROSS JOIN LATERAL (SELECT t.id, t.embedding {op} q.v AS d FROM {table} t "
        "ORDER BY t.embedding {op} q.v LIMIT {k}) r ORDER BY q.i, r.d"
    ).format(op=op, table=sql.Identifier(spec.name), k=sql.Literal(int(k)))


def copy_rows(ids: np.ndarray, vectors: np.ndarray) -> bytes:
    """The whole binary COPY stream of (id bigint, embedding vector) rows, built without a Python loop.

    Row: field count (int16 2), length 8 + id (int64), length 4+4*dim + pgvector's binary value (int16 dim,
    int16 unused, dim float32), all big-endian, between PGCOPY's header and trailer.
    """
    n, dim = vectors.shape
    row = np.dtype(
        [
            ("fields", ">i2"),
            ("id_len", ">i4"),
            ("id", ">i8"),
            ("vec_len", ">i4"),
            ("dim", ">i2"),
            ("unused", ">i2"),
            ("vec", ">f4", (dim,)),
        ]
    )
    rows = np.empty(n, dtype=row)
    rows["fields"], rows["id_len"], rows["id"] = 2, 8, ids
    rows["vec_len"], rows["dim"], rows["unused"] = 4 + 4 * dim, dim, 0
    rows["vec"] = vectors
    return PGCOPY_HEADER + rows.tobytes() + PGCOPY_TRAILER


def vector_dumper(oid: int) -> type:
    """A psycopg binary dumper for ``vector`` (oid of this database) from float32 numpy rows."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class VectorDumper(Dumper):
        format = Format.BINARY

        def dump(self, obj: Any) -> bytes:
            values = np.asarray(obj.values, dtype=">f4")
            return struct.pack(">hh", values.shape[0], 0) + values.tobytes()

    VectorDumper.oid = oid
    return VectorDumper


class Vec:
    """One query vector, dumped as pgvector's binary ``vector`` (see :func:`vector_dumper`)."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values


def analyze(spec: CollectionSpec) -> Any:
    """``ANALYZE <table>`` (planner statistics after the load)."""
    from psycopg import sql

    return sql.SQL("ANALYZE {}").format(sql.Identifier(spec.name))


def regclass_text(conn: Any, name: str) -> str:
    """``name`` quoted as an identifier, for ``to_regclass`` (which parses its text argument)."""
    from psycopg import sql

    return sql.Identifier(name).as_string(conn)
