"""psycopg 3 against PostgreSQL with pgvector: one table ``(id bigint primary key, embedding vector(dim))``.

* insert: binary ``COPY`` into a session's temporary staging table, then ``INSERT ... ON CONFLICT (id) DO
  UPDATE`` in the same transaction, so a retried batch overwrites instead of duplicating; ``insert_new`` (rows
  known absent) copies straight into the table.
* the index is built after the load (``CREATE INDEX`` with ``maintenance_work_mem`` and
  ``max_parallel_maintenance_workers``), or at creation when ``deferred_indexing`` is off.
* search: one statement per batch (``unnest`` of the queries, each ``LATERAL ... ORDER BY embedding <op> q
  LIMIT k``) after setting the index's knob (``hnsw.ef_search``, raised to k; ``ivfflat.probes`` /
  ``vchordrq.probes``, capped at the list count) and ``enable_seqscan = off`` (the planner would scan a small
  table instead of using its index, and the index is what is measured). Scores are the operator's values:
  cosine distance, negative inner product or L2 distance, as pgvector reports them.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from apps.vdb.base import Client, CollectionSpec, DatabaseError, Endpoints, SearchResult, StorageStats
from apps.vdb.pgvector import sql as q
from apps.vdb.pgvector.conn import connect, ensure_extension
from apps.vdb.pgvector.settings import PgvectorSettings

log = logging.getLogger(__name__)
STAGING = "pes2o_vdb_staging"


class PgvectorClient(Client):
    """One connection to the server of ``endpoints.entry(client_index)``."""

    def __init__(self, settings: PgvectorSettings, endpoints: Endpoints, client_index: int = 0) -> None:
        node = endpoints.entry(client_index)
        self.settings, self.endpoints, self.rank = settings, endpoints, node.rank
        self.request_timeout = settings.request_timeout_s
        self.spec: CollectionSpec | None = None
        self.knob: tuple[str, int] | None = None  # the search GUC value set on this session
        self.staging = False
        self.conn = connect(settings, node, timeout=min(30.0, settings.request_timeout_s))
        self._set("statement_timeout", f"{int(settings.request_timeout_s * 1000)}ms")

    def _set(self, name: str, value: str | int) -> None:
        """A session setting through ``set_config`` (a parameter: nothing is spliced into SQL)."""
        self.conn.execute("SELECT set_config(%s, %s, false)", (name, str(value)))

    def _bound(self) -> CollectionSpec:
        if self.spec is None:
            raise DatabaseError("pgvector: call create_collection first (it attaches to an existing table)")
        return self.spec

    def create_collection(self, spec: CollectionSpec, *, recreate: bool = False) -> None:
        """Create the extension and the table (and the index unless deferred), or attach to a compatible
        one."""
        from psycopg import sql
        from psycopg.types import TypeInfo

        q.index_method(spec, self.settings.extension)  # an index type pgvector cannot build fails here
        if spec.quantization != "none":
            raise DatabaseError(
                f"pgvector: quantization {spec.quantization!r} is not supported here (use none)"
            )
        if spec.shards != 1:
            log.warning("pgvector: one table on one server; vdb.collection.shards=%d is ignored", spec.shards)
        ensure_extension(self.conn, self.settings.extension)
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (spec.name,))
            if recreate:
                self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(spec.name)))
            self.conn.execute(q.create_table(spec))
            dim = self.conn.execute(
                "SELECT a.atttypmod, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
                "WHERE a.attrelid = to_regclass(%s) AND a.attname = 'embedding'",
                (q.regclass_text(self.conn, spec.name),),
            ).fetchone()
            if dim is None or dim[1] != "vector" or dim[0] != spec.dim:
                raise DatabaseError(
                    f"pgvector table {spec.name!r} exists with embedding {dim[1] if dim else 'missing'}"
                    f"({dim[0] if dim else '?'}), but vector({spec.dim}) was requested (use another name or "
                    "recreate it)"
                )
            if not spec.deferred_indexing and spec.index_type != "flat":
                self._create_index(spec)
        info = TypeInfo.fetch(self.conn, "vector")
        if info is None:
            raise DatabaseError("pgvector: the vector type is missing after CREATE EXTENSION")
        info.register(self.conn)
        self.conn.adapters.register_dumper(q.Vec, q.vector_dumper(info.oid))
        self.spec, self.knob, self.staging = spec, None, False

    def _create_index(self, spec: CollectionSpec) -> None:
        s = self.settings
        self._set("maintenance_work_mem", s.maintenance_work_mem)
        self._set("max_parallel_maintenance_workers", s.max_parallel_maintenance_workers)
        self.conn.execute(q.create_index(spec, s.extension))

    def _check(self, ids: np.ndarray | None, vectors: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
        dim = self._bound().dim
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != dim:
            raise DatabaseError(f"pgvector: {what} have shape {vectors.shape}, collection dimension is {dim}")
        if not np.isfinite(vectors).all():
            raise DatabaseError(f"pgvector: {what} hold NaN or infinite values (vector refuses them)")
        if ids is None:
            return np.empty(0, dtype=np.int64), vectors
        ids = np.asarray(ids, dtype=np.int64)
        if ids.shape != (len(vectors),):
            raise ValueError(f"pgvector: need {len(vectors)} row ids, got shape {ids.shape}")
        return ids, vectors

    def _copy(self, table: Any, ids: np.ndarray, vectors: np.ndarray) -> None:
        from psycopg import sql

        stmt = sql.SQL("COPY {} (id, embedding) FROM STDIN WITH (FORMAT BINARY)").format(table)
        with self.conn.cursor().copy(stmt) as copy:
            copy.write(q.copy_rows(ids, vectors))

    def insert(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Upsert: COPY into the staging table, then INSERT ... ON CONFLICT DO UPDATE, in one transaction."""
        from psycopg import sql

        ids, vectors = self._check(ids, vectors, "vectors")
        spec = self._bound()
        with self.conn.transaction():
            if not self.staging:
                self.conn.execute(
                    sql.SQL(
                        "CREATE TEMP TABLE IF NOT EXISTS {} (id bigint, embedding vector({})) "
                        "ON COMMIT DELETE ROWS"
                    ).format(sql.Identifier(STAGING), sql.Literal(spec.dim))
                )
                self.staging = True
            self._copy(sql.Identifier(STAGING), ids, vectors)
            self.conn.execute(
                sql.SQL(
                    "INSERT INTO {t} (id, embedding) SELECT DISTINCT ON (id) id, embedding FROM {s} "
                    "ORDER BY id ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding"
                ).format(t=sql.Identifier(spec.name), s=sql.Identifier(STAGING))
            )

    def insert_new(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Rows known absent: one binary COPY straight into the table (a duplicate id fails the batch)."""
        from psycopg import sql

        ids, vectors = self._check(ids, vectors, "vectors")
        with self.conn.transaction():
            self._copy(sql.Identifier(self._bound().name), ids, vectors)

    def wait_searchable(self, expected: int, timeout: float) -> None:
        """A committed COPY is visible at once: poll the exact count until ``expected`` rows are there."""
        missing = "pgvector: only {seen} of {expected} rows visible after {timeout:.0f}s"
        self.wait_for_count(expected, timeout, 0.2, missing)

    def build_index(self, timeout: float) -> None:
        """CREATE INDEX (flat: none), then ANALYZE; both bounded by ``timeout``."""
        spec = self._bound()
        self._set("statement_timeout", f"{int(timeout * 1000)}ms")
        try:
            if spec.index_type != "flat":
                self._create_index(spec)
            self.conn.execute(q.analyze(spec))
        finally:
            self._set("statement_timeout", f"{int(self.settings.request_timeout_s * 1000)}ms")

    def _set_knob(self, spec: CollectionSpec, k: int, ef: int | None) -> None:
        """The index's search knob for this request (set only when it changes)."""
        if spec.index_type == "flat":
            return
        guc = q.SEARCH_GUC[(spec.index_type, self.settings.extension)]
        if guc == "hnsw.ef_search":  # fewer than ef_search candidates means fewer than k results
            value = min(1000, max(k, ef if ef else self.settings.ef_search))
        else:  # probes: capped at the list count
            value = min(spec.ivf_nlist, ef if ef else self.settings.probes)
        if self.knob != (guc, value):
            if self.knob is None:  # small tables look cheaper to scan: the index is what is measured
                self._set("enable_seqscan", "off")
            self._set(guc, value)
            if self.settings.iterative_scan != "off" and self.settings.extension == "pgvector":
                self._set(guc.split(".")[0] + ".iterative_scan", self.settings.iterative_scan)
            self.knob = (guc, value)

    def search(self, queries: np.ndarray, k: int, ef: int | None) -> SearchResult:
        """All queries of the batch in one statement; short result lists are padded with id -1."""
        spec = self._bound()
        _, queries = self._check(None, queries, "queries")
        self._set_knob(spec, k, ef)
        vecs = [q.Vec(row) for row in queries]
        with self.conn.cursor(binary=True) as cur:
            cur.execute(q.search(spec, k), (vecs,))
            rows = cur.fetchall()
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.full((len(queries), k), np.nan, dtype=np.float32)
        if rows:
            got = np.array(rows, dtype=np.float64)
            qi = got[:, 0].astype(np.int64) - 1
            starts = np.searchsorted(qi, qi, side="left")
            col = np.arange(len(qi)) - starts
            ids[qi, col] = got[:, 1].astype(np.int64)
            scores[qi, col] = got[:, 2]
        return SearchResult(ids=ids, scores=scores)

    def count(self) -> int:
        """Exact row count."""
        from psycopg import sql

        name = sql.Identifier(self._bound().name)
        return int(self.conn.execute(sql.SQL("SELECT count(*) FROM {}").format(name)).fetchone()[0])

    def describe(self) -> StorageStats:
        """Rows, and the on-disk bytes of the table (heap + TOAST) and of the index, separately."""
        spec = self._bound()
        table = self.conn.execute(
            "SELECT to_regclass(%s)::oid", (q.regclass_text(self.conn, spec.name),)
        ).fetchone()[0]
        index = self.conn.execute(
            "SELECT to_regclass(%s)::oid", (q.regclass_text(self.conn, q.index_name(spec)),)
        )
        index_oid = index.fetchone()[0]
        sizes = self.conn.execute(
            "SELECT pg_relation_size(%s), pg_table_size(%s), pg_indexes_size(%s), pg_total_relation_size(%s)",
            (table, table, table, table),
        ).fetchone()
        method, index_bytes = None, None
        if index_oid is not None:
            method, index_bytes = self.conn.execute(
                "SELECT am.amname, pg_relation_size(c.oid) FROM pg_class c JOIN pg_am am ON am.oid = c.relam "
                "WHERE c.oid = %s",
                (index_oid,),
            ).fetchone()
        buffers = self.conn.execute("SHOW shared_buffers").fetchone()[0]
        return StorageStats(
            count=self.count(),
            segments=None,
            disk_bytes=int(sizes[3]),
            details={
                "heap_bytes": int(sizes[0]),
                "table_bytes": int(sizes[1]),  # heap + TOAST + free-space and visibility maps
                "index_bytes": int(index_bytes) if index_bytes is not None else None,
                "all_indexes_bytes": int(sizes[2]),  # the vector index and the primary key
                "index_method": method or "none (exact scan)",
                "shared_buffers": str(buffers),
                "extension": self.settings.extension,
            },
        )

    def close(self) -> None:
        """Close the connection."""
        conn = getattr(self, "conn", None)
        if conn is not None and not conn.closed:
            conn.close()
