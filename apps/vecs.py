"""Readers for the classic ANN benchmark files: ``.fvecs``/``.ivecs``/``.bvecs`` and ``.u8bin``/``.ibin``.

``*vecs`` files store, per row, an int32 dimension followed by that many float32 / int32 / uint8 values.
``*bin`` files (big-ann-benchmarks) start with two uint32 (rows, dims) followed by the row-major array.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

_VECS_DTYPES = {".fvecs": np.float32, ".ivecs": np.int32, ".bvecs": np.uint8}
_BIN_DTYPES = {".fbin": np.float32, ".ibin": np.int32, ".u8bin": np.uint8, ".i8bin": np.int8}


def _dtype_for(path: Path, dtypes: dict[str, str]) -> np.dtype:
    """The element type a vector file's suffix names (ValueError naming the file otherwise)."""
    try:
        return np.dtype(dtypes[path.suffix])
    except KeyError:
        raise ValueError(f"{path}: unknown vector file type {path.suffix!r}") from None


def read_vecs(path: str | Path) -> np.ndarray:
    """Read a ``.fvecs``, ``.ivecs`` or ``.bvecs`` file into a (rows, dim) array.

    Raises ValueError naming the file when rows have different dimensions or the size is not whole rows.
    """
    path = Path(path)
    dtype = _dtype_for(path, _VECS_DTYPES)
    raw = path.read_bytes()
    if len(raw) < 4:
        raise ValueError(f"{path}: file is empty or truncated")
    dim = int(np.frombuffer(raw[:4], dtype="<i4")[0])
    row_bytes = 4 + dim * dtype.itemsize
    if dim <= 0 or len(raw) % row_bytes:
        raise ValueError(f"{path}: {len(raw)} bytes is not a whole number of rows of dimension {dim}")
    rows = len(raw) // row_bytes
    table = np.frombuffer(raw, dtype=np.uint8).reshape(rows, row_bytes)
    dims = table[:, :4].copy().view("<i4").ravel()
    bad = np.flatnonzero(dims != dim)
    if bad.size:
        raise ValueError(f"{path}: row {int(bad[0])} has dimension {int(dims[bad[0]])}, expected {dim}")
    return table[:, 4:].copy().view(dtype.newbyteorder("<")).reshape(rows, dim)


def read_bin(path: str | Path) -> np.ndarray:
    """Read a big-ann-benchmarks ``.fbin`` / ``.ibin`` / ``.u8bin`` / ``.i8bin`` file."""
    path = Path(path)
    dtype = _dtype_for(path, _BIN_DTYPES)
    raw = path.read_bytes()
    rows, dim = (int(x) for x in np.frombuffer(raw[:8], dtype="<u4"))
    expected = 8 + rows * dim * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"{path}: header says {rows}x{dim} ({expected} bytes) but file has {len(raw)}")
    return np.frombuffer(raw, dtype=dtype, offset=8).reshape(rows, dim).copy()
