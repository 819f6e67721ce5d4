"""Dataset geometry: intrinsic dimensionality of the dataset and the queries, and their relative contrast.

The study's Lesson 2 (``../shared/papers/000``, §IV-B): a harder geometry (higher intrinsic dimension,
lower relative contrast) needs a larger ``ef`` to reach the same recall. The figures, all from a bounded
sample drawn with a fixed seed:

- **LID by maximum likelihood** (Levina & Bickel 2004; ``skdim.id.MLE``) from each point's ``k`` nearest
  neighbours (k = 20 by default): the mean, the median and the harmonic mean (the MLE-combined global
  estimate, MacKay & Ghahramani) of the local estimates. Dataset points: neighbours among the sample.
  Queries: neighbours in the data sample, and, when the ground truth holds ``k`` neighbours with
  convertible distances, in the whole dataset (``lid_queries_full``).
- **TwoNN** (Facco et al. 2017; ``skdim.id.TwoNN``) from the ratio of the 2nd to the 1st neighbour distance.
- **Relative contrast**, He, Kumar & Chang (ICML 2012): ``C_r = E_q[D_mean(q)] / E_q[D_min(q)]``, where
  ``D_mean(q)`` is the mean distance from query ``q`` to a random dataset point (estimated over the data
  sample) and ``D_min(q)`` its distance to its nearest neighbour in the whole dataset (from the ground
  truth; from the data sample when there is none, which underestimates the contrast: ``nn_source`` says
  which), copies at distance 0 skipped. The median of the per-query ratios is given beside it.

Distances are Euclidean between the vectors as the metric sees them: unit-normalised for ``cosine``
(chord distance, ``sqrt(2 (1 - cos))``, a monotone function of cosine distance), raw for ``l2`` and ``ip``.
The estimators are scikit-dimension's; the neighbour search (points against a reference set, which
scikit-dimension does not offer for queries) is a blocked matrix product here, with the k nearest
distances recomputed in float64 so that copies are exactly 0. A distance of 0 (an exact copy of the point,
e.g. a query that is also a dataset row) has no place in a local estimate: neighbour lists skip copies
and use the k nearest points at a non-zero distance, and ``with_copies`` counts the points that had any.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow.parquet as pq
from pydantic import BaseModel, Field, model_validator

from apps.dataset.groundtruth.exact_distance import exact_distances
from apps.dataset.layout import arrow_to_vectors, dataset_parts
from core.config import Strict
from core.errors import ArtifactError
from core.store import naming_damage, read_store_row_group, read_store_table

log = logging.getLogger(__name__)
Metric = Literal["cosine", "ip", "l2"]
BLOCK_ROWS = 512  # points per distance block (x the reference size in float32)
EXACT_ROWS = 32  # points per float64 recomputation (x candidates x dim x 8 bytes)
SPARE_COPIES = 8  # candidates beyond k, so that k non-zero distances remain after skipping copies


class GeometryConfig(Strict):
    """The dataset-geometry analysis (intrinsic dimension, relative contrast) on a bounded sample."""

    enabled: bool = Field(True, description="Run the geometry stage after the dataset and queries.")
    sample_rows: int = Field(
        5000,
        ge=50,
        le=200_000,
        description="At most this many dataset rows and this many queries are sampled (fixed seed).",
    )
    k: int = Field(20, ge=3, le=1000, description="Neighbours per point for the LID (MLE) estimate.")
    seed: int = Field(0, ge=0, description="Seed of the row and query sample.")
    max_row_groups: int = Field(
        64,
        ge=1,
        description="Parquet row groups read at most (random, weighted by rows): bounds the bytes read "
        "on a large dataset; the sample is drawn uniformly within them.",
    )

    @model_validator(mode="after")
    def _k_below_sample(self) -> GeometryConfig:
        if self.k >= self.sample_rows:
            raise ValueError(f"geometry.k {self.k} must be below geometry.sample_rows {self.sample_rows}")
        return self


class LidEstimate(BaseModel):
    """Summary of the local (per-point) MLE estimates of one point set."""

    mean: float
    median: float
    harmonic: float = Field(description="1 / mean(1 / local): the MLE-combined global estimate")
    points: int = Field(description="points with a finite estimate")
    with_copies: int = Field(0, description="points with an exact copy (distance 0) skipped as a neighbour")


class GeometryRecord(BaseModel):
    """What the geometry stage found (``geometry.json``)."""

    metric: Metric
    distance: str
    k: int
    seed: int
    dataset_rows: int
    sample_rows: int
    row_groups_read: int | None = None
    row_groups_total: int | None = None
    queries_total: int | None = None
    query_rows: int | None = None
    lid_dataset: LidEstimate
    twonn_dataset: float
    lid_queries: LidEstimate | None = None
    lid_queries_full: LidEstimate | None = None
    twonn_queries: float | None = None
    relative_contrast: float | None = None
    relative_contrast_median: float | None = None
    mean_distance: float | None = None
    nn_distance: float | None = None
    nn_source: Literal["groundtruth", "sample"] | None = None
    library: str
    seconds: float = 0.0


def prepare(vectors: np.ndarray, metric: str) -> np.ndarray:
    """float32 vectors as the metric compares them (cosine: unit length; zero vectors stay zero)."""
    out = np.array(vectors, dtype=np.float32)
    if metric == "cosine":
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out /= np.where(norms > 0, norms, 1.0)
    return out


def euclidean_from_metric(distances: np.ndarray, metric: str) -> np.ndarray | None:
    """Ground-truth distances (1 − cos, L2) as Euclidean distances of prepared vectors; None for ip."""
    d = np.asarray(distances, dtype=np.float64)
    if metric == "cosine":
        return np.sqrt(np.clip(2.0 * d, 0.0, None))
    if metric == "l2":
        return d
    return None  # -ip has no Euclidean equivalent without the norms


def neighbours(
    points: np.ndarray, reference: np.ndarray, k: int, self_match: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(k nearest non-zero Euclidean distances (n, k) float64 ascending, mean distance to ``reference``
    (n,), copies at distance 0 (n,)).

    ``self_match``: ``points`` is ``reference`` and a point is not its own neighbour (nor counted in its
    mean). Candidates (k + ``SPARE_COPIES``) come from float32 products and are recomputed in float64;
    a row with more copies than that has ``inf`` at its end (left out by the estimators).
    """
    ref_sq = np.einsum("ij,ij->i", reference, reference, dtype=np.float64)
    candidates = min(k + SPARE_COPIES, len(reference) - int(self_match))
    dists = np.empty((len(points), candidates))
    means = np.empty(len(points))
    for start in range(0, len(points), BLOCK_ROWS):
        block = points[start : start + BLOCK_ROWS]
        sq = np.einsum("ij,ij->i", block, block, dtype=np.float64)
        d2 = sq[:, None] + ref_sq[None, :] - 2.0 * (block @ reference.T).astype(np.float64)
        np.clip(d2, 0.0, None, out=d2)
        if self_match:
            own = np.arange(len(block))
            d2[own, start + own] = np.inf
        full = np.sqrt(d2)
        finite = np.where(np.isfinite(full), full, 0.0)
        means[start : start + len(block)] = finite.sum(1) / (reference.shape[0] - int(self_match))
        idx = np.argpartition(d2, candidates - 1, axis=1)[:, :candidates]
        for sub in range(0, len(block), EXACT_ROWS):  # (rows, candidates, dim) float64 stays small
            rows = slice(sub, sub + EXACT_ROWS)
            exact = exact_distances(block[rows], reference[idx[rows]], "l2")  # float64, fixed order
            dists[start + sub : start + sub + len(exact)] = exact
    knn, copies = skip_copies(dists, k)
    return knn, means, copies


def skip_copies(distances: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k smallest non-zero distances per row, ascending (``inf`` where fewer), and the zeros per row."""
    d = np.asarray(distances, dtype=np.float64)
    copies = (d <= 0).sum(axis=1)
    d = np.sort(np.where(d > 0, d, np.inf), axis=1)[:, :k]
    if d.shape[1] < k:
        d = np.pad(d, ((0, 0), (0, k - d.shape[1])), constant_values=np.inf)
    return d, copies


def lid_mle(points: np.ndarray, knn: np.ndarray, copies: np.ndarray) -> LidEstimate:
    """Per-point MLE of ``points`` from their sorted non-zero neighbour distances ``knn`` (skdim.id.MLE)."""
    import skdim

    keep = np.isfinite(knn).all(axis=1)
    if keep.sum() < 2:
        raise ArtifactError("fewer than 2 points with k neighbours at a non-zero distance: no LID estimate")
    kept = knn[keep]
    with warnings.catch_warnings():  # "n_neighbors >= len(X)": about its own search, not used here
        warnings.filterwarnings("ignore", message="n_neighbors >= len", category=UserWarning)
        mle = skdim.id.MLE().fit(
            points[keep],
            precomputed_knn_arrays=(kept, np.zeros(kept.shape, dtype=np.int64)),
            n_neighbors=kept.shape[1],
            comb="mean",
        )
    local = np.asarray(mle.dimension_pw_, dtype=np.float64)
    local = local[np.isfinite(local) & (local > 0)]
    return LidEstimate(
        mean=float(local.mean()),
        median=float(np.median(local)),
        harmonic=float(1.0 / np.mean(1.0 / local)),
        points=int(local.size),
        with_copies=int((copies > 0).sum()),
    )


def twonn(knn: np.ndarray) -> float:
    """TwoNN from the first two neighbour distances (skdim.id.TwoNN on precomputed (r1, r2))."""
    import skdim

    r = knn[np.isfinite(knn[:, 1])][:, :2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(skdim.id.TwoNN(dist=True).fit(r).dimension_)


def _library() -> str:
    from importlib.metadata import version

    return f"scikit-dimension {version('scikit-dimension')}"


def estimate_geometry(
    vectors: np.ndarray,
    queries: np.ndarray | None,
    metric: Metric,
    k: int = 20,
    seed: int = 0,
    nn_distances: np.ndarray | None = None,
    dataset_rows: int | None = None,
) -> GeometryRecord:
    """Geometry of a dataset sample ``vectors`` and (optionally) ``queries``; a pure function.

    ``nn_distances``: the queries' exact neighbour distances over the whole dataset (ground truth, in the
    metric's own definition, (Q, ≥1), rows aligned with ``queries``), used for ``D_min`` and, with ≥ k
    columns, for ``lid_queries_full``. ``dataset_rows``: rows of the whole dataset (default: the sample's).
    """
    started = time.time()
    data = prepare(vectors, metric)
    if len(data) <= k:
        raise ArtifactError(
            f"the geometry stage needs more than geometry.k = {k} dataset rows; the sample has {len(data)}: "
            "lower geometry.k or set geometry.enabled: false"
        )
    knn, _, copies = neighbours(data, data, k, self_match=True)
    record: dict[str, Any] = {
        "metric": metric,
        "distance": "euclidean (unit-normalised: chord)" if metric == "cosine" else "euclidean",
        "k": k,
        "seed": seed,
        "dataset_rows": dataset_rows or len(data),
        "sample_rows": len(data),
        "lid_dataset": lid_mle(data, knn, copies),
        "twonn_dataset": twonn(knn),
        "library": _library(),
    }
    if queries is not None and len(queries):
        q = prepare(queries, metric)
        qknn, qmean, qcopies = neighbours(q, data, k, self_match=False)
        record.update(query_rows=len(q), lid_queries=lid_mle(q, qknn, qcopies), twonn_queries=twonn(qknn))
        dmin, source = qknn[:, 0], "sample"
        full = None if nn_distances is None else euclidean_from_metric(nn_distances, metric)
        if full is not None:
            fknn, fcopies = skip_copies(full, k)
            dmin, source = fknn[:, 0], "groundtruth"
            if np.isfinite(fknn).all(axis=1).sum() >= 2:
                record["lid_queries_full"] = lid_mle(q, fknn, fcopies)
        positive = np.isfinite(dmin)
        dmin, qmean = dmin[positive], qmean[positive]
        record.update(
            relative_contrast=float(qmean.mean() / dmin.mean()) if len(dmin) else None,
            relative_contrast_median=float(np.median(qmean / dmin)) if len(dmin) else None,
            mean_distance=float(qmean.mean()),
            nn_distance=float(dmin.mean()),
            nn_source=source,
        )
    record["seconds"] = round(time.time() - started, 3)
    return GeometryRecord(**record)


def sample_dataset(
    dataset_dir: Path, rows: int, seed: int, max_row_groups: int
) -> tuple[np.ndarray, dict[str, int]]:
    """Up to ``rows`` vectors drawn without replacement, reading at most ``max_row_groups`` row groups.

    Only Parquet footers are read for the plan; then only the chosen row groups' ``embedding`` column.
    """
    groups: list[tuple[Path, int, int]] = []
    for part in dataset_parts(Path(dataset_dir)):
        with naming_damage(part):
            meta = pq.ParquetFile(part).metadata
        groups += [(part, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
    sizes = np.array([g[2] for g in groups], dtype=np.int64)
    total = int(sizes.sum())
    if total == 0:
        raise ArtifactError(f"{dataset_dir}: the dataset has no rows")
    rng = np.random.default_rng(seed)
    chosen = np.arange(len(groups))
    if len(groups) > max_row_groups:
        chosen = np.sort(rng.choice(len(groups), max_row_groups, replace=False, p=sizes / total))
    pool = int(sizes[chosen].sum())
    picks = np.sort(rng.choice(pool, min(rows, pool), replace=False))
    offsets = np.concatenate([[0], np.cumsum(sizes[chosen])])
    blocks = []
    for i, g in enumerate(chosen):
        local = picks[(picks >= offsets[i]) & (picks < offsets[i + 1])] - offsets[i]
        if local.size:
            part, group, _ = groups[g]
            table = read_store_row_group(part, group, ["embedding"])
            blocks.append(arrow_to_vectors(table.column("embedding").take(local)))
    info = {"dataset_rows": total, "row_groups_read": len(blocks), "row_groups_total": len(groups)}
    return np.concatenate(blocks), info


def dataset_geometry(
    dataset_dir: str | Path,
    queries_file: str | Path | None,
    groundtruth_file: str | Path | None,
    metric: Metric,
    config: GeometryConfig,
) -> GeometryRecord:
    """Sample the dataset (and queries), read the ground truth's nearest distances, estimate."""
    vectors, info = sample_dataset(Path(dataset_dir), config.sample_rows, config.seed, config.max_row_groups)
    queries = nn = None
    queries_total = None
    if queries_file is not None:
        table = read_store_table(queries_file, columns=["id", "embedding"])
        queries_total = table.num_rows
        rng = np.random.default_rng([config.seed, 1])
        take = np.sort(rng.choice(table.num_rows, min(config.sample_rows, table.num_rows), replace=False))
        table = table.take(take)
        queries = arrow_to_vectors(table.column("embedding"))
        if groundtruth_file is not None:
            nn = _groundtruth_distances(Path(groundtruth_file), table.column("id").to_numpy())
    record = estimate_geometry(
        vectors, queries, metric, config.k, config.seed, nn, dataset_rows=info["dataset_rows"]
    )
    return record.model_copy(
        update={
            "row_groups_read": info["row_groups_read"],
            "row_groups_total": info["row_groups_total"],
            "queries_total": queries_total,
        }
    )


def _groundtruth_distances(path: Path, query_ids: np.ndarray) -> np.ndarray | None:
    """The ground truth's distances (Q, k) for ``query_ids`` in that order; None when absent."""
    table = read_store_table(path)
    if "distances" not in table.column_names:
        return None
    ids = table.column("query_id").to_numpy()
    order = np.argsort(ids, kind="stable")
    pos = np.searchsorted(ids, query_ids, sorter=order).clip(max=len(ids) - 1)
    rows = order[pos]
    if not np.array_equal(ids[rows], query_ids):
        raise ArtifactError(f"{path}: the ground truth lacks some sampled query ids")
    return arrow_to_vectors(table.column("distances").take(rows))
