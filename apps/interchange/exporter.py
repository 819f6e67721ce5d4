"""Export a project dataset (parts + queries + ground truth) to the ANN community's formats.

* ``fvecs`` / ``bvecs``: ``base.<fmt>``, ``query.<fmt>``, ``groundtruth.ivecs``;
* ``fbin`` / ``u8bin`` / ``i8bin``: ``base.<fmt>``, ``query.<fmt>``, ``groundtruth.ibin`` (ids, then
  float32 distances);
* ``npy``: ``base.npy``, ``query.npy`` (float32), ``groundtruth.npy`` (int32), ``distances.npy``;
* ``hdf5``: ``<name>.hdf5`` with ``train``, ``test``, ``neighbors``, ``distances``, attr ``distance``;
* ``vdbbench``: ``train.parquet`` (id, emb), ``test.parquet`` (id, emb), ``neighbors.parquet``
  (id, neighbors_id).

Outside ``vdbbench`` neighbours are 0-based base rows; when the dataset's ids are not already 0..n-1 (a
pipeline-built dataset: ``shard * 10**9 + row``) ``ids.npy`` (or HDF5 ``ids``) maps each row to its id.
Distances are the project's: L2, 1 - cosine, or -inner product. ``uint8`` / ``int8`` formats refuse
vectors that are not integers in range. The folder is written beside the target and renamed into place.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from apps.dataset.layout import dataset_manifest, dataset_problems, iter_vectors
from apps.interchange import vecs
from apps.interchange.formats import HDF5_DISTANCE, list_matrix, parquet_file
from core.errors import ArtifactError, ConfigError, InputDataError
from core.store import (
    MANIFEST,
    ensure_writable_dir,
    os_error_reason,
    read_manifest,
    staged_directory,
)

EXPORT_FORMATS = ("fvecs", "bvecs", "fbin", "u8bin", "i8bin", "npy", "hdf5", "vdbbench")


@dataclass
class ProjectDataset:
    """A dataset folder with its queries and ground truth, as the vdb stages read them."""

    dataset_dir: Path
    queries_file: Path
    groundtruth_file: Path
    metric: str
    name: str


def locate(
    dataset_dir: Path, queries: Path | None = None, groundtruth: Path | None = None, metric: str | None = None
) -> ProjectDataset:
    """The queries and ground truth of ``dataset_dir``: its own (an imported dataset) or the given files
    (a pipeline-built dataset: ``store/queries/<key>/``, ``store/groundtruth/<key>/``).

    ``metric`` names the ground truth's metric only when nothing recorded it: contradicting the record
    would relabel neighbours computed with another distance (InputDataError).
    """
    manifest = dataset_manifest(dataset_dir)
    problems = dataset_problems(dataset_dir, manifest)
    if problems:
        raise ArtifactError(f"{dataset_dir}: damaged dataset ({problems[0]}); import or build it again")

    def resolve(given: Path | None, role: str, file_name: str) -> Path:
        if given is not None:
            path = given / file_name if given.is_dir() else given
        elif role in manifest:
            path = dataset_dir / manifest[role]["file"]
        else:
            raise InputDataError(
                f"{dataset_dir}: a pipeline-built dataset holds no {role}; name them with --queries and "
                "--groundtruth (the stages' folders, which `python -m pipeline plan <config>` lists)"
            )
        if not path.is_file():
            raise InputDataError(f"{path}: no such file ({role} of {dataset_dir})")
        return path

    queries_file = resolve(queries, "queries", "queries.parquet")
    gt_file = resolve(groundtruth, "groundtruth", "groundtruth.parquet")
    # The ground truth's recorded metric (its own record, or the groundtruth stage's manifest beside a
    # given file), else the dataset's.
    if groundtruth is None:
        recorded = manifest["groundtruth"].get("metric") or manifest.get("metric")
    else:
        recorded = (read_manifest(gt_file.parent) or {}).get("metric") or manifest.get("metric")
    if metric and recorded and metric != recorded:
        raise InputDataError(
            f"{gt_file}: the ground truth was computed with metric {recorded}; --metric {metric} would "
            "relabel it (give --metric only when the metric is not recorded)"
        )
    found = recorded or metric
    if found not in HDF5_DISTANCE:
        raise InputDataError(f"{gt_file}: its metric is unknown; give --metric l2, ip or cosine")
    name = (manifest.get("metadata") or {}).get("dataset_name") or dataset_dir.name
    return ProjectDataset(dataset_dir, queries_file, gt_file, found, name)


def _read(path: Path, columns: list[str], optional: tuple[str, ...] = ()) -> pa.Table:
    """``columns`` (and those of ``optional`` present) of a Parquet file; InputDataError naming it."""
    parquet = parquet_file(path, columns)
    wanted = columns + [c for c in optional if c in parquet.schema_arrow.names]
    try:
        return parquet.read(columns=wanted)
    except (OSError, pa.ArrowException) as exc:
        raise InputDataError(f"{path}: not a readable Parquet file ({exc})") from None


def read_queries(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ids, (Q, dim) float32 vectors) of a queries.parquet."""
    table = _read(path, ["id", "embedding"])
    return table.column("id").to_numpy(), list_matrix(
        table.column("embedding"), path, "embedding", np.float32
    )


def read_groundtruth(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(query ids, neighbour ids (Q, k) int64, distances (Q, k) float32 or None) of a groundtruth.parquet."""
    table = _read(path, ["query_id", "neighbors"], optional=("distances",))
    neighbors = list_matrix(table.column("neighbors"), path, "neighbors", np.int64)
    distances = None
    if "distances" in table.column_names:
        distances = list_matrix(table.column("distances"), path, "distances", np.float32)
        if distances.shape != neighbors.shape:
            raise InputDataError(
                f"{path}: distances {distances.shape} and neighbors {neighbors.shape} differ"
            )
    return table.column("query_id").to_numpy(), neighbors, distances


def _refuse_inside(out_dir: Path, dataset: ProjectDataset) -> None:
    """ArtifactError when ``out_dir`` lies inside the dataset, its store or a stage folder it reads."""
    out = out_dir.resolve()
    data = dataset.dataset_dir.resolve()
    guarded = [(data, "the dataset")]
    if data.parent.name == "datasets":  # store/datasets/<name>-<key>: the whole store is content-keyed
        guarded.append((data.parent.parent, "the dataset's store"))
    for file in (dataset.queries_file, dataset.groundtruth_file):
        if (file.parent / MANIFEST).is_file():  # a stage's content-keyed folder
            guarded.append((file.parent.resolve(), "a stage folder"))
    for folder, what in guarded:
        if out == folder or folder in out.parents:
            raise ArtifactError(f"{out_dir}: inside {what} ({folder}); export outside it")


def _list_column(vectors: np.ndarray) -> pa.ListArray:
    """(n, d) float32 -> list<float32> (VectorDBBench reads ``emb`` as a list column)."""
    n, d = vectors.shape
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * d, pa.int32())
    return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(vectors, np.float32).ravel()))


def _write_parquet_batches(path: Path, schema: pa.Schema, tables: Iterable[pa.Table]) -> None:
    """Stream tables into one zstd Parquet file (temp name, then renamed: whole or absent)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd", use_dictionary=False) as writer:
            for table in tables:
                writer.write_table(table, row_group_size=4096)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_vdbbench(
    out_dir: Path,
    base: Iterable[tuple[np.ndarray, np.ndarray]],
    query_ids: np.ndarray,
    query_vectors: np.ndarray,
    gt_query_ids: np.ndarray,
    neighbors: np.ndarray,
) -> None:
    """VectorDBBench's custom-dataset layout: ``train.parquet`` (id, emb) streamed from ``base`` batches,
    ``test.parquet`` (id, emb) and ``neighbors.parquet`` (id, neighbors_id: list<int64>, nearest first)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("id", pa.int64()), ("emb", pa.list_(pa.float32()))])
    tables = (
        pa.table({"id": pa.array(i, pa.int64()), "emb": _list_column(v)}, schema=schema) for i, v in base
    )
    _write_parquet_batches(out_dir / "train.parquet", schema, tables)
    test = pa.table(
        {"id": pa.array(query_ids, pa.int64()), "emb": _list_column(query_vectors)}, schema=schema
    )
    _write_parquet_batches(out_dir / "test.parquet", schema, [test])
    offsets = pa.array(np.arange(len(neighbors) + 1, dtype=np.int32) * neighbors.shape[1], pa.int32())
    lists = pa.ListArray.from_arrays(offsets, pa.array(neighbors.ravel(), pa.int64()))
    gt = pa.table({"id": pa.array(gt_query_ids, pa.int64()), "neighbors_id": lists})
    _write_parquet_batches(out_dir / "neighbors.parquet", gt.schema, [gt])


def _base_ids(dataset_dir: Path) -> np.ndarray:
    """Every row's id, in dataset order (the id column only is read)."""
    from apps.dataset.layout import dataset_parts

    return np.concatenate(
        [pq.read_table(part, columns=["id"]).column("id").to_numpy() for part in dataset_parts(dataset_dir)]
    ).astype(np.int64)


def _row_positions(ids: np.ndarray, wanted: np.ndarray, where: Path) -> np.ndarray:
    """Row numbers of ``wanted`` ids; InputDataError when one is not in the dataset."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    pos = np.searchsorted(sorted_ids, wanted).clip(max=len(ids) - 1)
    bad = sorted_ids[pos] != wanted
    if bad.any():
        raise InputDataError(f"{where}: neighbour id {int(wanted[bad][0])} is not in the dataset")
    return order[pos]


def _vectors(dataset: ProjectDataset, batch_rows: int = 65536) -> Iterator[np.ndarray]:
    for _, vectors in iter_vectors(dataset.dataset_dir, batch_rows):
        yield vectors


def export_dataset(dataset: ProjectDataset, fmt: str, out_dir: Path) -> dict[str, Any]:
    """Write ``dataset`` in ``fmt`` into ``out_dir`` (new or empty); return what was written."""
    if fmt not in EXPORT_FORMATS:
        raise InputDataError(f"unknown export format {fmt!r}: expected one of {', '.join(EXPORT_FORMATS)}")
    _refuse_inside(out_dir, dataset)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ArtifactError(f"{out_dir}: exists and is not an empty folder; choose a new one")
    manifest = read_manifest(dataset.dataset_dir) or {}
    query_ids, query_vectors = read_queries(dataset.queries_file)
    gt_query_ids, neighbors, distances = read_groundtruth(dataset.groundtruth_file)
    if not np.array_equal(query_ids, gt_query_ids):
        raise InputDataError(
            f"{dataset.groundtruth_file}: query ids differ from {dataset.queries_file} (order or members)"
        )
    if query_vectors.shape[1] != manifest.get("dimension"):
        raise InputDataError(
            f"{dataset.queries_file}: dimension {query_vectors.shape[1]}, dataset {manifest.get('dimension')}"
        )
    try:
        ensure_writable_dir(out_dir.parent)
    except OSError as exc:
        parent = out_dir.parent
        reason = (
            f"{parent} is a file" if parent.exists() and not parent.is_dir() else os_error_reason(exc, parent)
        )
        raise ConfigError(f"cannot create the output folder: {reason}", file=str(out_dir)) from None
    try:
        with staged_directory(out_dir) as tmp:
            try:
                if fmt == "vdbbench":
                    base = iter_vectors(dataset.dataset_dir, 65536)
                    write_vdbbench(tmp, base, query_ids, query_vectors, gt_query_ids, neighbors)
                else:
                    _write_rows_format(dataset, fmt, tmp, manifest, query_vectors, neighbors, distances)
            except ValueError as exc:  # a writer's message names the file inside the temp folder
                raise InputDataError(str(exc).replace(str(tmp), str(out_dir))) from None
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise ArtifactError(f"{out_dir}: written by someone else meanwhile; choose a new one") from None
        raise
    return {
        "dir": str(out_dir),
        "format": fmt,
        "rows": manifest.get("rows"),
        "dim": int(query_vectors.shape[1]),
        "queries": len(query_ids),
        "k": int(neighbors.shape[1]),
        "metric": dataset.metric,
        "files": sorted(p.name for p in out_dir.iterdir()),
    }


def _write_rows_format(
    dataset: ProjectDataset,
    fmt: str,
    out: Path,
    manifest: dict[str, Any],
    query_vectors: np.ndarray,
    neighbors: np.ndarray,
    distances: np.ndarray | None,
) -> None:
    """Every format whose neighbours are base row numbers."""
    ids = _base_ids(dataset.dataset_dir)
    rows, dim = len(ids), int(manifest["dimension"])
    identity = bool(np.array_equal(ids, np.arange(rows)))
    gt_rows = neighbors if identity else _row_positions(ids, neighbors.ravel(), dataset.groundtruth_file)
    gt_rows = np.asarray(gt_rows, np.int64).reshape(neighbors.shape)
    if distances is None:
        distances = np.zeros(neighbors.shape, np.float32)
    if fmt in ("fvecs", "bvecs"):
        vecs.write_vecs(out / f"base.{fmt}", _vectors(dataset))
        vecs.write_vecs(out / f"query.{fmt}", [query_vectors])
        vecs.write_vecs(out / "groundtruth.ivecs", [gt_rows])
    elif fmt in ("fbin", "u8bin", "i8bin"):
        vecs.write_bin(out / f"base.{fmt}", (rows, dim), _vectors(dataset))
        vecs.write_bin(out / f"query.{fmt}", query_vectors.shape, [query_vectors])
        vecs.write_ibin_groundtruth(out / "groundtruth.ibin", gt_rows, distances)
    elif fmt == "npy":
        base = np.lib.format.open_memmap(out / "base.npy", mode="w+", dtype=np.float32, shape=(rows, dim))
        start = 0
        for batch in _vectors(dataset):
            base[start : start + len(batch)] = batch
            start += len(batch)
        base.flush()
        del base
        np.save(out / "query.npy", query_vectors.astype(np.float32))
        np.save(out / "groundtruth.npy", gt_rows.astype(np.int32))
        np.save(out / "distances.npy", distances.astype(np.float32))
    else:
        _write_hdf5(out / f"{dataset.name}.hdf5", dataset, rows, dim, query_vectors, gt_rows, distances)
    if not identity:
        if fmt == "hdf5":
            import h5py

            with h5py.File(out / f"{dataset.name}.hdf5", "a") as h5:
                h5.create_dataset("ids", data=ids)
        else:
            np.save(out / "ids.npy", ids)


def _write_hdf5(
    path: Path,
    dataset: ProjectDataset,
    rows: int,
    dim: int,
    query_vectors: np.ndarray,
    gt_rows: np.ndarray,
    distances: np.ndarray,
) -> None:
    """An ann-benchmarks HDF5 file, the base streamed into ``train``."""
    import h5py

    with h5py.File(path, "w") as h5:
        h5.attrs["distance"] = HDF5_DISTANCE[dataset.metric]
        h5.attrs["dimension"] = dim
        h5.attrs["point_type"] = "float"
        h5.attrs["type"] = "dense"
        train = h5.create_dataset("train", shape=(rows, dim), dtype=np.float32)
        start = 0
        for batch in _vectors(dataset):
            train[start : start + len(batch)] = batch
            start += len(batch)
        h5.create_dataset("test", data=query_vectors.astype(np.float32))
        h5.create_dataset("neighbors", data=gt_rows.astype(np.int32))
        h5.create_dataset("distances", data=distances.astype(np.float32))
