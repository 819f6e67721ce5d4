"""Shared by both sides of ``benchmarks/ingest.py``: the dataset they upload, the settings of
``configs/local.yaml``, and the CPU meter."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import _common
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

LOCAL_CONFIG = _common.REPO / "configs" / "local.yaml"
FMNIST = Path("/work/shared/data/ann/fmnist1k/fmnist1k_base.fvecs")
COLLECTION = "ingest_bench"


# --- data --------------------------------------------------------------------------------------------------


def project_dataset() -> Path | None:
    """The newest complete dataset of the project's store (``store/datasets/*/manifest.json``)."""
    found = sorted(
        (p.parent for p in (_common.REPO / "store" / "datasets").glob("*/manifest.json")),
        key=lambda d: (d / "manifest.json").stat().st_mtime,
    )
    return found[-1] if found else None


def read_dataset(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ids, float32 vectors) of every part, in dataset order."""
    from apps.dataset import arrow_to_vectors, dataset_parts

    ids, vectors = [], []
    for part in dataset_parts(directory):
        table = pq.read_table(part, columns=["id", "embedding"])
        ids.append(table.column("id").to_numpy())
        vectors.append(arrow_to_vectors(table.column("embedding")))
    return np.concatenate(ids), np.concatenate(vectors)


def write_dataset(directory: Path, ids: np.ndarray, vectors: np.ndarray, sizes: list[int], rg: int) -> Path:
    """``ids``/``vectors`` in the project's dataset layout: parts of ``sizes`` rows, row groups ``rg``."""
    from apps.dataset import finalize_dataset, vectors_to_arrow
    from core.store import write_parquet_atomic

    directory.mkdir(parents=True, exist_ok=True)
    records, start = [], 0
    for shard, size in enumerate(sizes):
        rows = slice(start, start + size)
        start += size
        table = pa.table(
            {
                "id": ids[rows],
                "doc_id": ids[rows].astype(str),
                "chunk_index": np.zeros(size, np.int32),
                "embedding": vectors_to_arrow(vectors[rows], "float32"),
            }
        )
        name = f"part-{shard:05d}.parquet"
        written = write_parquet_atomic(table, directory / name, row_group_rows=rg)
        records.append({"file": name, "shard": shard, **written})
    finalize_dataset(str(directory), directory.name, records, {"dimension": vectors.shape[1]}, {})
    return directory


def bench_dataset(rows: int | None) -> dict[str, Any]:
    """The dataset both sides load: the project's (or its first ``rows``), else fmnist1k in 4 parts."""
    source = project_dataset()
    if source is not None:
        ids, vectors = read_dataset(source)
        label, metric, directory = f"store/datasets/{source.name}", "cosine", source
        if rows and rows < len(ids):  # the first rows, with the source's part boundaries
            from core.store import read_manifest

            sizes, left = [], rows
            for entry in read_manifest(source)["files"]:
                sizes.append(min(entry["rows"], left))
                left -= sizes[-1]
                if not left:
                    break
            ids, vectors = ids[:rows], vectors[:rows]
            directory = _common.OUT / "work" / f"ingest-{source.name}-{rows}"
            if not (directory / "manifest.json").exists():
                write_dataset(directory, ids, vectors, sizes, 8192)
            label += f" (first {rows} rows)"
    else:
        from apps.vecs import read_vecs

        base = read_vecs(FMNIST)[: rows or None]
        ids, vectors = np.arange(len(base), dtype=np.int64), base
        directory = _common.OUT / "work" / f"ingest-fmnist1k-{len(base)}"
        if not (directory / "manifest.json").exists():
            quarter = -(-len(base) // 4)
            sizes = [min(quarter, len(base) - i * quarter) for i in range(4)]
            write_dataset(directory, ids, vectors, [s for s in sizes if s > 0], 100)
        label, metric = f"fmnist1k ({FMNIST})", "l2"
    from apps.insert import work_units

    return {
        "dir": directory,
        "label": label,
        "metric": metric,
        "ids": ids,
        "vectors": vectors,
        "units": work_units(str(directory)),
    }


# --- configuration: the settings of configs/local.yaml -----------------------------------------------------


def vdb_config() -> Any:
    from pipeline.config import VdbConfig

    return VdbConfig.model_validate(yaml.safe_load(LOCAL_CONFIG.read_text())["vdb"])


def settings_for(database: str, cfg: Any) -> Any:
    """The adapter settings of ``database`` as configs/local.yaml gives them (qdrant-local: local mode)."""
    from apps.vdb import get_adapter

    name = "qdrant" if database == "qdrant-local" else database
    found = next((s for s in cfg.databases if s.name == name), None)
    settings = found or get_adapter(name).settings(name=name)
    if database == "qdrant-local":
        settings = settings.model_copy(update={"mode": "server", "url": None})  # local_path set at start
    return settings


class CpuMeter:
    """CPU seconds since creation: this process, its reaped children (pool clients), the server tree."""

    def __init__(self, server_pids: list[int]) -> None:
        self.server_pids = server_pids
        self.start = self._snapshot()

    def _snapshot(self) -> tuple[float, float, float]:
        import resource

        import psutil

        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # pool processes, once joined
        server = 0.0
        for pid in self.server_pids:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(pid)
                for proc in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        t = proc.cpu_times()
                        server += t.user + t.system
        return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime, server

    def read(self) -> dict[str, float]:
        end = self._snapshot()
        own, kids, server = (b - a for a, b in zip(self.start, end, strict=True))
        return {"client_cpu_s": own + kids, "server_cpu_s": server}


def target_of(ctx: dict[str, Any], settings: Any | None = None) -> Any:
    """The stages' DatabaseTarget for this context (``settings`` overrides the context's)."""
    from apps.vdb.records import DatabaseTarget

    return DatabaseTarget(
        settings=settings or ctx["settings"], endpoints=ctx["endpoints"], collection=ctx["spec"]
    )
