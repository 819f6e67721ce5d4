"""The ANN community's dataset formats, opened as one :class:`Source`: base vectors (streamed), queries and
published ground truth.

* ``hdf5``: one ann-benchmarks file, datasets ``train`` / ``test`` / ``neighbors`` (+ ``distances``),
  attribute ``distance`` (euclidean, angular, dot);
* ``vecs``: 3 files or a folder: ``.fvecs``/``.bvecs`` base and queries, ``.ivecs`` ground truth;
* ``bin``: 3 files or a folder: ``.fbin``/``.u8bin``/``.i8bin`` base and queries, ``.ibin`` ground truth
  (ids, with or without distances);
* ``npy``: 3 files or a folder: 2-D ``.npy`` base and queries, ``.npy`` neighbour ids;
* ``vdbbench``: a folder: ``train.parquet`` (id, emb), ``test.parquet`` (id, emb), ``neighbors.parquet``
  (id, neighbors_id).

Neighbour ids are 0-based base rows, except in ``vdbbench`` where they are the ``id`` column's values.
Every problem is an :class:`InputDataError` naming the file and what is wrong.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from apps.interchange import vecs
from core.errors import InputDataError

IMPORT_FORMATS = ("hdf5", "vecs", "bin", "npy", "vdbbench")
# Spellings of a format by its file suffix; they open like their family.
ALIASES = {"fvecs": "vecs", "bvecs": "vecs", "fbin": "bin", "u8bin": "bin", "i8bin": "bin", "h5": "hdf5"}
# The project's metric -> ann-benchmarks' HDF5 ``distance`` attribute, and back (the project's own names
# are accepted on reading too).
HDF5_DISTANCE = {"l2": "euclidean", "cosine": "angular", "ip": "dot"}
HDF5_METRICS = {**{attr: metric for metric, attr in HDF5_DISTANCE.items()}, **{m: m for m in HDF5_DISTANCE}}
VDBBENCH_FILES = ("train.parquet", "test.parquet", "neighbors.parquet")


@dataclass
class Source:
    """A dataset to import: base rows streamed in batches, queries and ground truth in memory."""

    files: dict[str, Path]  # role (base, queries, groundtruth) -> file
    rows: int
    dim: int
    base_dtype: str  # the stored element type (float32, uint8, int8, ...)
    batches: Callable[[int], Iterator[tuple[np.ndarray, np.ndarray]]]  # rows -> (ids, vectors)
    query_ids: np.ndarray
    queries: np.ndarray  # (Q, dim) float32
    gt_ids: np.ndarray  # (Q, k) int64
    gt_distances: np.ndarray | None = None
    metric: str | None = None  # what the file declares (HDF5's ``distance``), None when it says nothing
    ids_are_rows: bool = True  # neighbour ids are base row numbers (all but vdbbench)
    notes: list[str] = field(default_factory=list)
    inside: dict[str, str] = field(default_factory=dict)  # role -> dataset name in the file (HDF5)

    def where(self, role: str) -> str:
        """The file holding ``role`` and, in an HDF5 file, the dataset inside it."""
        inside = self.inside.get(role)
        return f"{self.files[role]}: dataset {inside!r}" if inside else str(self.files[role])

    def check(self, ordered: bool = False) -> None:
        """Shapes agree: queries' dimension with the base's, ground-truth rows with the queries. ``ordered``:
        the user gave the files in order, so shapes that disagree may be a swapped pair (said so)."""
        order = " (the files are read as base, queries, ground truth, in that order)" if ordered else ""
        if self.queries.ndim != 2 or self.queries.shape[1] != self.dim:
            raise InputDataError(
                f"{self.files['queries']}: queries have dimension {self.queries.shape[-1]}, "
                f"the base {self.files['base']} has {self.dim}{order}"
            )
        if len(self.gt_ids) != len(self.queries):
            raise InputDataError(
                f"{self.files['groundtruth']}: {len(self.gt_ids)} ground-truth rows for "
                f"{len(self.queries)} queries in {self.files['queries']}{order}"
            )
        if self.gt_distances is not None and self.gt_distances.shape != self.gt_ids.shape:
            raise InputDataError(
                f"{self.files['groundtruth']}: distances {self.gt_distances.shape} and "
                f"neighbours {self.gt_ids.shape} differ in shape"
            )
        first_bad_row(self.queries, self.files["queries"], "query")
        if self.ids_are_rows and self.gt_ids.size:
            bad = np.flatnonzero((self.gt_ids < 0) | (self.gt_ids >= self.rows))
            if bad.size:
                q, pos = divmod(int(bad[0]), self.gt_ids.shape[1])
                raise InputDataError(
                    f"{self.files['groundtruth']}: {bad.size} neighbour id(s) outside the base's rows "
                    f"0..{self.rows - 1}; first: query {q}, position {pos}: {int(self.gt_ids.flat[bad[0]])}"
                )


def _as_float32(values: Any) -> np.ndarray:
    """``values`` as float32; one beyond its range becomes inf, which :func:`first_bad_row` names (numpy's
    overflow warning would reach the console without the file)."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float32)


def first_bad_row(vectors: np.ndarray, path: Path, what: str, offset: int = 0) -> None:
    """Refuse vectors holding NaN or an infinite value, naming the file and the first such row
    (``offset``: the row number of ``vectors[0]`` in the file): every distance to it is undefined."""
    step = 65_536  # rows tested at once: the boolean mask of a million GIST rows would take 1 GB
    for start in range(0, len(vectors), step):
        finite = np.isfinite(vectors[start : start + step]).all(axis=1)
        if not finite.all():
            row = offset + start + int(np.argmin(finite))
            raise InputDataError(
                f"{path}: {what} row {row} (0-based) holds NaN or an infinite value (or one beyond "
                "float32's range, ±3.4e38, which the dataset stores)"
            )


# What a refused element type holds, for the message (numpy's own name is kept beside it).
_KIND_NAMES = {
    "U": "text",
    "S": "bytes",
    "O": "Python objects or variable-length strings",
    "c": "complex numbers",
    "V": "records or raw bytes",
    "M": "dates",
    "m": "time spans",
    "b": "booleans",
}


def _type_name(dtype: np.dtype) -> str:
    kind = _KIND_NAMES.get(dtype.kind)
    return f"{dtype} ({kind})" if kind else str(dtype)


def real_values(dtype: np.dtype, where: str, role: str) -> None:
    """Refuse ``role`` values (base, query, distance) that are not real numbers: text or records fail the
    float32 conversion without naming the file, and complex ones lose their imaginary part silently."""
    if dtype.kind not in "biuf":
        raise InputDataError(f"{where}: {role} values must be real numbers, not {_type_name(dtype)}")


def integer_ids(dtype: np.dtype, where: str) -> None:
    """Refuse neighbour ids that are not integers (floats would be truncated: 3.5 becomes row 3)."""
    if dtype.kind not in "iu":
        raise InputDataError(f"{where}: neighbour ids must be integers, not {_type_name(dtype)}")


def canonical_format(name: str) -> str:
    """The family a format name (or alias) belongs to; InputDataError for an unknown one."""
    fmt = ALIASES.get(name.lower(), name.lower())
    if fmt not in IMPORT_FORMATS:
        raise InputDataError(f"unknown format {name!r}: expected one of {', '.join(IMPORT_FORMATS)}")
    return fmt


def _named(path: Path | str, exc: Exception, where: str = "") -> str:
    """``exc``'s message, led by ``path`` (and ``where``) unless the reader's message already names it."""
    message = str(exc)
    if message.startswith(str(path)):
        return message
    return f"{path}: {where}: {message}" if where else f"{path}: {message}"


def _row_batches(array: Any, rows: int, path: Path | str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(row ids, float32 vectors) batches of anything sliceable by rows (memmap, VecsFile, h5py) read
    from ``path``."""
    total = len(array)
    for start in range(0, total, rows):
        stop = min(start + rows, total)
        try:  # a VecsFile checks each row's dimension as it is read; h5py raises OSError on a bad chunk
            vectors = _as_float32(array[start:stop])
        except (ValueError, OSError) as exc:
            raise InputDataError(_named(path, exc, f"rows {start}..{stop - 1}")) from None
        yield np.arange(start, stop, dtype=np.int64), vectors


def _array_batches(array: Any, path: Path) -> Callable[[int], Iterator[tuple[np.ndarray, np.ndarray]]]:
    return lambda rows: _row_batches(array, rows, path)


def _opened(path: Path, opener: Callable[[Path], Any]) -> Any:
    """``opener(path)``; its ValueError or OSError as an InputDataError naming ``path``."""
    try:
        return opener(path)
    except ValueError as exc:  # the readers' messages start with the path
        raise InputDataError(_named(path, exc)) from None
    except OSError as exc:
        raise InputDataError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def _whole(opener: Callable[[Path], Any]) -> Callable[[Path], np.ndarray]:
    """An opener that also reads every row (inside :func:`_opened`, so a bad row is an InputDataError)."""
    return lambda path: opener(path)[:]


# --- file triples: vecs, bin, npy -------------------------------------------------------------------------

_SUFFIXES = {
    "vecs": ((".fvecs", ".bvecs"), (".ivecs",)),
    "bin": ((".fbin", ".u8bin", ".i8bin"), (".ibin",)),
    "npy": ((".npy",), (".npy",)),
}
# A file's role by the words of its stem (split on ``_ - .``), a word optionally followed by digits
# (``gt100``, ``query10k``). Base words in order of preference: SIFT1M/GIST1M ship ``*_learn`` (a training
# sample for quantizers) beside ``*_base``, and the base is the one to import.
_ROLE_WORDS = {
    "groundtruth": ("groundtruth", "gt", "neighbors", "neighbours", "knn"),
    "queries": ("query", "queries", "test"),
    "base": ("base", "train", "data", "learn"),
}


def _words(path: Path) -> list[str]:
    """A file stem's lower-case words, trailing digits dropped: ``sift_query.10k`` -> sift, query, k."""
    words = [w.rstrip("0123456789") for w in re.split(r"[_\-.]+", path.stem.lower())]
    joined = [a + b for a, b in itertools.pairwise(words) if (a, b) == ("ground", "truth")]
    return words + joined


def _rank(path: Path, role: str) -> int | None:
    """Position of the first of ``role``'s words the stem holds (lower is preferred); None: none."""
    words = _words(path)
    ranks = [i for i, word in enumerate(_ROLE_WORDS[role]) if word in words]
    return min(ranks) if ranks else None


def _pick(folder: Path, role: str, hits: list[Path]) -> Path | None:
    """The file of ``role`` among ``hits``: the one with the most preferred word; error on a tie."""
    ranked = [(r, p) for p in hits if (r := _rank(p, role)) is not None]
    if not ranked:
        return None
    best = min(r for r, _ in ranked)
    named = [p for r, p in ranked if r == best]
    if len(named) > 1:
        raise InputDataError(
            f"{folder}: more than one {role} file ({', '.join(p.name for p in named)}); "
            "name the three files instead"
        )
    return named[0]


def _count(n: int) -> str:
    return {2: "two", 3: "three", 4: "four"}.get(n, str(n))


def find_files(fmt: str, paths: list[Path]) -> dict[str, Path]:
    """Base, queries and ground-truth files: three paths in that order, or one folder searched by name."""
    for path in paths:
        if not path.exists():
            raise InputDataError(f"{path}: no such file or directory")
    if len(paths) == 3:
        if folders := [p for p in paths if p.is_dir()]:  # one rule for every role, before any is opened
            raise InputDataError(
                f"{folders[0]}: a folder; {fmt} takes three files (base, queries, ground truth) or one folder"
            )
        return dict(zip(("base", "queries", "groundtruth"), paths, strict=True))
    if len(paths) == 2 and not any(p.is_dir() for p in paths):
        raise InputDataError(
            f"{fmt}: no base file: {len(paths)} files given ({', '.join(map(str, paths))}), "
            "3 needed: base, queries and ground truth, in that order"
        )
    if len(paths) != 1 or not paths[0].is_dir():
        raise InputDataError(
            f"{fmt}: give the base, queries and ground-truth files (in that order) or one folder holding "
            f"them; got {len(paths)} path(s): {', '.join(map(str, paths))}"
        )
    folder = paths[0]
    vector_suffixes, gt_suffixes = _SUFFIXES[fmt]
    files = sorted(p for p in folder.iterdir() if p.suffix in vector_suffixes + gt_suffixes)
    found: dict[str, Path] = {}
    for role in ("groundtruth", "queries", "base"):
        suffixes = gt_suffixes if role == "groundtruth" else vector_suffixes
        hits = [p for p in files if p.suffix in suffixes and p not in found.values()]
        if role == "groundtruth" and gt_suffixes != vector_suffixes and len(hits) == 1:
            chosen: Path | None = hits[0]  # the suffix alone names it
        else:
            chosen = _pick(folder, role, hits)
        if chosen is None and role == "base" and len(hits) == 1:
            chosen = hits[0]  # the one vector file left is the base, whatever its name
        if chosen is None and role == "base" and len(hits) > 1 and "queries" not in found:
            raise InputDataError(
                f"{folder}: {_count(len(hits))} candidate base files {', '.join(p.name for p in hits)}; "
                "name them base/query or give the three paths"
            )
        if chosen is not None:
            found[role] = chosen
    missing = [role for role in ("base", "queries", "groundtruth") if role not in found]
    if missing:
        have = ", ".join(f"{role} {path.name}" for role, path in found.items()) or "nothing usable"
        wanted = {"base": vector_suffixes, "queries": vector_suffixes, "groundtruth": gt_suffixes}
        raise InputDataError(
            f"{folder}: no {' and no '.join(missing)} file "
            f"({'/'.join(dict.fromkeys(s for r in missing for s in wanted[r]))} with "
            f"{' / '.join('|'.join(_ROLE_WORDS[r]) for r in missing)} in the name); found {have}"
            + _other_format_hint(fmt, folder)
        )
    return found


def _other_format_hint(fmt: str, folder: Path) -> str:
    """``; its files look like format X`` when the folder holds another format's files (``bin`` given a
    folder of .fvecs), else empty."""
    present = {p.suffix for p in folder.iterdir()}
    others = [
        other
        for other, (vectors, truth) in _SUFFIXES.items()
        if other != fmt and present & set(vectors) and present & set(truth)
    ]
    return f"; its files look like format {' or '.join(others)}" if others else ""


def _open_triple(fmt: str, paths: list[Path]) -> Source:
    files = find_files(fmt, paths)
    if fmt == "vecs":
        base = _opened(files["base"], vecs.open_vecs)
        queries = _opened(files["queries"], _whole(vecs.open_vecs))
        gt_ids, gt_distances = _opened(files["groundtruth"], _whole(vecs.open_vecs)), None
        base_dtype = base.dtype.name
    elif fmt == "bin":
        base = _opened(files["base"], vecs.open_bin)
        queries = _opened(files["queries"], vecs.open_bin)
        gt_ids, gt_distances = _opened(files["groundtruth"], vecs.read_ibin_groundtruth)
        base_dtype = base.dtype.name
    else:
        base = _opened(files["base"], vecs.open_npy)
        queries = _opened(files["queries"], vecs.open_npy)
        gt_ids, gt_distances = _opened(files["groundtruth"], vecs.open_npy), None
        base_dtype = base.dtype.name
    # .npy files may hold any element type (the others' types are fixed by their suffix)
    real_values(base.dtype, str(files["base"]), "base")
    real_values(queries.dtype, str(files["queries"]), "query")
    integer_ids(gt_ids.dtype, str(files["groundtruth"]))
    return Source(
        files=files,
        rows=len(base),
        dim=int(base.shape[1]),
        base_dtype=base_dtype,
        batches=_array_batches(base, files["base"]),
        query_ids=np.arange(len(queries), dtype=np.int64),
        queries=_as_float32(queries),
        gt_ids=np.asarray(gt_ids, dtype=np.int64),
        gt_distances=None if gt_distances is None else np.asarray(gt_distances, np.float32),
    )


# --- HDF5 (ann-benchmarks) ------------------------------------------------------------------------------


# The ann-benchmarks datasets and what they hold (``distances`` is optional).
_HDF5_ROLES = {"train": "base", "test": "query", "neighbors": "neighbour id", "distances": "distance"}


def _h5_read(h5: Any, key: str, path: Path, dtype: Any) -> np.ndarray:
    """Dataset ``key`` of an open HDF5 file as ``dtype``; h5py's OSError (a damaged chunk, a missing
    filter) as an InputDataError naming the file and the dataset."""
    try:
        return np.asarray(h5[key], dtype)
    except OSError as exc:
        raise InputDataError(f"{path}: dataset {key!r}: cannot read it ({exc})") from None


def _open_hdf5(paths: list[Path]) -> Source:
    import h5py

    if len(paths) != 1:
        raise InputDataError(f"hdf5: give one ann-benchmarks .hdf5 file, got {', '.join(map(str, paths))}")
    path = paths[0]
    if not path.exists():
        raise InputDataError(f"{path}: no such file or directory")
    if not path.is_file():
        raise InputDataError(f"{path}: a folder; hdf5 takes the ann-benchmarks .hdf5 file itself")
    try:
        h5 = h5py.File(path, "r")
    except OSError as exc:
        raise InputDataError(f"{path}: not a readable HDF5 file ({exc})") from None
    with h5:  # queries and ground truth are read here; the base is reopened per pass (see batches)
        for key, role in _HDF5_ROLES.items():
            if key not in h5:
                if key == "distances":  # optional
                    continue
                raise InputDataError(f"{path}: no {key!r} dataset (found {', '.join(sorted(h5)) or 'none'})")
            node = h5[key]
            if not isinstance(node, h5py.Dataset):
                raise InputDataError(
                    f"{path}: {key!r} is an HDF5 {type(node).__name__.lower()}, not a dataset"
                )
            if node.ndim != 2:
                raise InputDataError(f"{path}: {key!r} has shape {node.shape}, expected 2-D")
            if key == "neighbors":
                integer_ids(node.dtype, f"{path}: dataset {key!r}")
            else:
                real_values(node.dtype, f"{path}: dataset {key!r}", role)
        declared = h5.attrs.get("distance")
        if isinstance(declared, bytes):
            declared = declared.decode()
        metric = None
        if declared is not None:
            metric = HDF5_METRICS.get(str(declared).lower())
            if metric is None:
                raise InputDataError(
                    f"{path}: attribute distance={declared!r} is not one of {', '.join(HDF5_METRICS)}"
                )
        rows, dim = (int(x) for x in h5["train"].shape)
        base_dtype = h5["train"].dtype.name
        distances = _h5_read(h5, "distances", path, np.float32) if "distances" in h5 else None
        queries = _h5_read(h5, "test", path, np.float32)
        gt_ids = _h5_read(h5, "neighbors", path, np.int64)

    def batches(batch_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        with h5py.File(path, "r") as base:  # h5py reads the slice asked for, nothing more
            yield from _row_batches(base["train"], batch_rows, f"{path}: dataset 'train'")

    return Source(
        files={"base": path, "queries": path, "groundtruth": path},
        rows=rows,
        dim=dim,
        base_dtype=base_dtype,
        batches=batches,
        query_ids=np.arange(len(queries), dtype=np.int64),
        queries=queries,
        gt_ids=gt_ids,
        gt_distances=distances,
        metric=metric,
        inside={"base": "train", "queries": "test", "groundtruth": "neighbors"},
    )


# --- VectorDBBench Parquet -------------------------------------------------------------------------------


def list_matrix(
    column: pa.ChunkedArray | pa.Array, path: Path, name: str, dtype: Any, first_row: int = 0
) -> np.ndarray:
    """A list / fixed_size_list column of equal-length rows -> (n, width) array; InputDataError naming the
    first row (0-based in the file: ``first_row`` is the column's first) that is null or of another length."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    integral = np.dtype(dtype).kind in "iu"  # ids: floats would be truncated, not refused
    is_list = pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type)
    values = column.type.value_type if is_list else None
    if values is None or not (pa.types.is_integer(values) or (pa.types.is_floating(values) and not integral)):
        wanted = "integers" if integral else "numbers"
        raise InputDataError(f"{path}: column {name!r} is {column.type}, expected a list of {wanted}")
    if len(column) == 0:
        return np.zeros((0, 0), dtype)
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputDataError(f"{path}: column {name!r}: row {first_row + row} (0-based) is null")
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    if (lengths != lengths[0]).any():
        row = int(np.flatnonzero(lengths != lengths[0])[0])
        raise InputDataError(
            f"{path}: column {name!r}: row {first_row + row} (0-based) has {lengths[row]} values, "
            f"row {first_row} has {lengths[0]}"
        )
    flat = column.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype).reshape(len(column), int(lengths[0]))


def parquet_file(path: Path, columns: list[str]) -> pq.ParquetFile:
    """``path`` opened as Parquet with ``columns`` present; InputDataError naming the file otherwise."""
    try:  # pages written with a CRC (the store's, core.store) are checked as they are read
        parquet = pq.ParquetFile(path, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as exc:
        raise InputDataError(f"{path}: not a readable Parquet file ({exc})") from None
    absent = [c for c in columns if c not in parquet.schema_arrow.names]
    if absent:
        raise InputDataError(
            f"{path}: no column {', '.join(map(repr, absent))} (has {', '.join(parquet.schema_arrow.names)})"
        )
    return parquet


def _read_all(path: Path, columns: list[str]) -> pa.Table:
    """``columns`` of a Parquet file, nulls refused; InputDataError naming it when it cannot be read."""
    try:
        table = parquet_file(path, columns).read(columns=columns)
    except (OSError, pa.ArrowException) as exc:
        raise InputDataError(f"{path}: not a readable Parquet file ({exc})") from None
    if table.column("id").null_count:
        raise InputDataError(f"{path}: column 'id' has nulls")
    return table


def _checked(path: Path, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches``, a damaged page or a null id becoming an InputDataError naming ``path``."""
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as exc:
            raise InputDataError(f"{path}: not a readable Parquet file ({exc})") from None
        if batch.column("id").null_count:
            raise InputDataError(f"{path}: column 'id' has nulls")
        yield batch


def _open_vdbbench(paths: list[Path]) -> Source:
    if len(paths) != 1 or not paths[0].is_dir():
        raise InputDataError(f"vdbbench: give the folder holding {', '.join(VDBBENCH_FILES)}")
    folder = paths[0]
    missing = [name for name in VDBBENCH_FILES if not (folder / name).is_file()]
    if missing:
        raise InputDataError(f"{folder}: no {' and no '.join(missing)}")
    base_path, test_path, gt_path = (folder / name for name in VDBBENCH_FILES)
    train = parquet_file(base_path, ["id", "emb"])
    first = train.read_row_group(0, columns=["emb"]) if train.num_row_groups else None
    dim = list_matrix(first.column("emb"), base_path, "emb", np.float32).shape[1] if first else 0
    test = _read_all(test_path, ["id", "emb"])
    gt = _read_all(gt_path, ["id", "neighbors_id"])
    for path, schema in ((base_path, train.schema_arrow), (test_path, test.schema), (gt_path, gt.schema)):
        if not pa.types.is_integer(id_type := schema.field("id").type):
            raise InputDataError(f"{path}: column 'id' is {id_type}, expected integers")
    query_ids = test.column("id").to_numpy().astype(np.int64)
    gt_query_ids = gt.column("id").to_numpy().astype(np.int64)
    if not np.array_equal(np.sort(query_ids), np.sort(gt_query_ids)):
        raise InputDataError(f"{gt_path}: its query ids are not those of {test_path}")
    order = np.argsort(gt_query_ids)[np.argsort(np.argsort(query_ids))]  # gt rows in test's order
    gt_ids = list_matrix(gt.column("neighbors_id"), gt_path, "neighbors_id", np.int64)[order]

    def batches(rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        start = 0
        for batch in _checked(base_path, train.iter_batches(batch_size=rows, columns=["id", "emb"])):
            vectors = list_matrix(batch.column("emb"), base_path, "emb", np.float32, start)
            if vectors.shape[1] != dim:
                raise InputDataError(
                    f"{base_path}: column 'emb': row {start} (0-based) has {vectors.shape[1]} values, row 0 "
                    f"has {dim}"
                )
            yield batch.column("id").to_numpy().astype(np.int64), vectors
            start += batch.num_rows

    return Source(
        files={"base": base_path, "queries": test_path, "groundtruth": gt_path},
        rows=train.metadata.num_rows,
        dim=dim,
        base_dtype="float32",
        batches=batches,
        query_ids=query_ids,
        queries=list_matrix(test.column("emb"), test_path, "emb", np.float32),
        gt_ids=gt_ids,
        ids_are_rows=False,
    )


def open_source(fmt: str, paths: list[str | Path]) -> Source:
    """Open a dataset in ``fmt`` (see the module table) and check that its parts fit together."""
    fmt = canonical_format(fmt)
    resolved = [Path(p).expanduser() for p in paths]
    if fmt == "hdf5":
        source = _open_hdf5(resolved)
    elif fmt == "vdbbench":
        source = _open_vdbbench(resolved)
    else:
        source = _open_triple(fmt, resolved)
    if source.rows == 0:
        raise InputDataError(f"{source.where('base')}: the base holds no vectors")
    if source.dim == 0:
        raise InputDataError(f"{source.where('base')}: the base's vectors have dimension 0")
    if len(source.queries) == 0:
        raise InputDataError(f"{source.where('queries')}: no queries (0 rows)")
    if source.gt_ids.shape[1] == 0:  # every format's ground truth is 2-D by now
        raise InputDataError(f"{source.where('groundtruth')}: no neighbours per query (k=0)")
    source.check(ordered=len(resolved) == 3)
    return source
