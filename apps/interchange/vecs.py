"""Readers and writers for the classic ANN benchmark files, memory-mapped: nothing is read until asked for.

* ``.fvecs`` / ``.ivecs`` / ``.bvecs``: per row, an int32 dimension then that many float32 / int32 / uint8.
* ``.fbin`` / ``.u8bin`` / ``.i8bin`` / ``.ibin`` (big-ann-benchmarks): two uint32 (rows, dims), then the
  row-major array. A ground-truth ``.ibin`` may carry, after the ``rows * dims`` int32 ids, as many float32
  distances (big-ann-benchmarks' ground-truth layout); :func:`read_ibin_groundtruth` accepts both.
* ``.npy``: a 2-D array (numpy's own header), memory-mapped.

Every error is a ValueError whose message starts with the file's path.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

VECS_DTYPES = {".fvecs": np.float32, ".ivecs": np.int32, ".bvecs": np.uint8}
BIN_DTYPES = {".fbin": np.float32, ".ibin": np.int32, ".u8bin": np.uint8, ".i8bin": np.int8}
NPY_MAGIC = b"\x93NUMPY"


def _dtype_for(path: Path, dtypes: dict[str, type]) -> np.dtype:
    """The element type a vector file's suffix names (ValueError naming the file otherwise)."""
    try:
        return np.dtype(dtypes[path.suffix]).newbyteorder("<")
    except KeyError:
        known = ", ".join(dtypes)
        raise ValueError(f"{path}: unknown vector file type {path.suffix!r} (expected {known})") from None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None


class VecsFile:
    """A ``*vecs`` file as a (rows, dim) memory-mapped view; the per-row dimensions are checked by
    :meth:`rows_of` for the rows read (a full check would read the whole file at open)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        dtype = _dtype_for(self.path, VECS_DTYPES)
        size = _size(self.path)
        if size < 4:
            raise ValueError(f"{self.path}: file is empty or truncated ({size} bytes)")
        dim = int(np.fromfile(self.path, dtype="<i4", count=1)[0])
        row_bytes = 4 + dim * dtype.itemsize
        if dim <= 0 or size % row_bytes:
            raise ValueError(
                f"{self.path}: {size} bytes is not a whole number of rows of dimension {dim} "
                f"({row_bytes} bytes each): truncated or not a {self.path.suffix} file"
            )
        record = np.dtype([("dim", "<i4"), ("values", dtype, (dim,))])
        self._records = np.memmap(self.path, dtype=record, mode="r", shape=(size // row_bytes,))
        self.dim, self.dtype, self.shape = dim, dtype, (size // row_bytes, dim)

    def __len__(self) -> int:
        return self.shape[0]

    def rows_of(self, index: slice | np.ndarray) -> np.ndarray:
        """The rows at ``index`` (a slice or sorted positions), dimensions checked, as an in-memory array."""
        records = self._records[index]
        dims = records["dim"]
        bad = np.flatnonzero(dims != self.dim)
        if bad.size:
            row = np.arange(len(self))[index][bad[0]]
            raise ValueError(
                f"{self.path}: row {int(row)} has dimension {int(dims[bad[0]])}, expected {self.dim}"
            )
        return np.array(records["values"])

    def __getitem__(self, index: slice | np.ndarray) -> np.ndarray:
        return self.rows_of(index)


def open_vecs(path: str | Path) -> VecsFile:
    """A ``.fvecs`` / ``.ivecs`` / ``.bvecs`` file, memory-mapped."""
    return VecsFile(path)


def read_vecs(path: str | Path) -> np.ndarray:
    """Read a whole ``.fvecs``, ``.ivecs`` or ``.bvecs`` file into a (rows, dim) array.

    Raises ValueError naming the file when rows have different dimensions or the size is not whole rows.
    """
    return open_vecs(path)[:]


def _bin_header(path: Path) -> tuple[int, int, int]:
    """(rows, dims, file size) of a ``*bin`` file."""
    size = _size(path)
    if size < 8:
        raise ValueError(f"{path}: file is empty or truncated ({size} bytes, the header alone is 8)")
    rows, dim = (int(x) for x in np.fromfile(path, dtype="<u4", count=2))
    return rows, dim, size


def open_bin(path: str | Path) -> np.ndarray:
    """A big-ann-benchmarks ``.fbin`` / ``.ibin`` / ``.u8bin`` / ``.i8bin`` file as a read-only memmap."""
    path = Path(path)
    dtype = _dtype_for(path, BIN_DTYPES)
    rows, dim, size = _bin_header(path)
    expected = 8 + rows * dim * dtype.itemsize
    if dim == 0:  # the sizes would agree (8 bytes and 8): say what is wrong instead
        raise ValueError(f"{path}: header says {rows}x{dim}: vectors of dimension 0")
    if size != expected:
        raise ValueError(f"{path}: header says {rows}x{dim} ({expected} bytes) but the file has {size} bytes")
    return np.memmap(path, dtype=dtype, mode="r", offset=8, shape=(rows, dim))


def read_bin(path: str | Path) -> np.ndarray:
    """Read a whole big-ann-benchmarks ``*bin`` file into memory."""
    return np.array(open_bin(path))


def read_ibin_groundtruth(path: str | Path) -> tuple[np.ndarray, np.ndarray | None]:
    """(ids (n, k) int32, distances (n, k) float32 or None) of a big-ann ground-truth ``.ibin``.

    Both layouts are accepted: ids only (``8 + n*k*4`` bytes) or ids then distances (``8 + n*k*8``).
    """
    path = Path(path)
    rows, k, size = _bin_header(path)
    if rows == 0 or k == 0:  # else the size check below would contradict itself (8 bytes or 8)
        empty = "no queries (0 rows)" if rows == 0 else "no neighbours per query (k=0)"
        raise ValueError(f"{path}: header says {rows}x{k}: {empty}")
    ids_bytes = rows * k * 4
    if size not in (8 + ids_bytes, 8 + 2 * ids_bytes):
        raise ValueError(
            f"{path}: header says {rows}x{k}: expected {8 + ids_bytes} bytes (ids) or {8 + 2 * ids_bytes} "
            f"(ids and distances), the file has {size}"
        )
    ids = np.memmap(path, dtype="<i4", mode="r", offset=8, shape=(rows, k))
    if size == 8 + ids_bytes:
        return ids, None
    return ids, np.memmap(path, dtype="<f4", mode="r", offset=8 + ids_bytes, shape=(rows, k))


def open_npy(path: str | Path) -> np.ndarray:
    """A 2-D ``.npy`` array, memory-mapped (ValueError naming the file when it is not one)."""
    path = Path(path)
    _size(path)
    with open(path, "rb") as fh:
        magic = fh.read(len(NPY_MAGIC))
    if magic != NPY_MAGIC:  # else numpy blames "pickled (object) data" for any other bytes
        raise ValueError(f"{path}: not a .npy array file (it does not start with numpy's header)")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npy file ({exc})") from None
    if array.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D array (rows, dim), found shape {array.shape}")
    return array


# --- writers: stream (rows, dim) batches to a file -----------------------------------------------------


def _checked_cast(batch: np.ndarray, dtype: np.dtype, path: Path) -> np.ndarray:
    """``batch`` as ``dtype``; a value the type cannot hold exactly is a ValueError naming ``path``."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if batch.size and (
            batch.min() < info.min or batch.max() > info.max or not np.array_equal(batch, np.round(batch))
        ):
            raise ValueError(
                f"{path}: values are not all integers in [{info.min}, {info.max}] ({dtype.name})"
            )
    return np.ascontiguousarray(batch, dtype=dtype.newbyteorder("<"))


def write_vecs(path: str | Path, batches: Iterable[np.ndarray]) -> int:
    """Write (rows, dim) batches as a ``*vecs`` file of the suffix's type; return the rows written."""
    path = Path(path)
    dtype = _dtype_for(path, VECS_DTYPES)
    rows = 0
    with open(path, "wb") as fh:
        for batch in batches:
            values = _checked_cast(batch, dtype, path)
            record = np.empty(len(values), np.dtype([("dim", "<i4"), ("values", dtype, (values.shape[1],))]))
            record["dim"], record["values"] = values.shape[1], values
            record.tofile(fh)
            rows += len(values)
    return rows


def write_bin(path: str | Path, shape: tuple[int, int], batches: Iterable[np.ndarray]) -> None:
    """Write (rows, dim) batches as a big-ann ``*bin`` file of the suffix's type, ``shape`` in the header."""
    path = Path(path)
    dtype = _dtype_for(path, BIN_DTYPES)
    written = 0
    with open(path, "wb") as fh:
        np.array(shape, dtype="<u4").tofile(fh)
        for batch in batches:
            _checked_cast(batch, dtype, path).tofile(fh)
            written += len(batch)
    if written != shape[0]:
        raise ValueError(f"{path}: {written} rows written, the header says {shape[0]}")


def write_ibin_groundtruth(path: str | Path, ids: np.ndarray, distances: np.ndarray | None) -> None:
    """A big-ann ground-truth ``.ibin``: header, int32 ids, then (when given) float32 distances."""
    path = Path(path)
    with open(path, "wb") as fh:
        np.array(ids.shape, dtype="<u4").tofile(fh)
        _checked_cast(ids, np.dtype(np.int32), path).tofile(fh)
        if distances is not None:
            np.ascontiguousarray(distances, dtype="<f4").tofile(fh)
