"""FAISS's durable row store: what the insert stage writes and the index stage reads, in another process.

A FAISS index lives in the memory of one process, while the pipeline's insert, index and query tasks may
run in different worker processes; so inserted rows go to disk, one file per batch, under
``<collection>/rows/``:

* ``batch-<first id>-<rows>-<crc32 of the ids>.rows`` holds two ``.npy`` arrays back to back: the int64
  ids, then the float32 ``(rows, dim)`` vectors (``np.load`` on an open file reads them in turn);
* a batch is written to a temporary name beside it and renamed into place, so a reader sees the whole
  batch or none of it, and only names of that pattern are ever read (a temporary file never is);
* a retried batch carries the same ids, so it has the same name and overwrites its first attempt: a retry
  never duplicates. An id sent again in another batch (an upsert) is resolved when reading: the copy in
  the most recently written file wins, and ``count`` counts distinct ids.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

PATTERN = re.compile(r"^batch-\d{20}-\d+-[0-9a-f]{8}\.rows$")
# Ids of the batch files this process has read, by (path, inode, mtime, size): counting again after
# every upload must not re-read every file. 8 bytes per row.
_IDS: dict[tuple[str, int, int, int], np.ndarray] = {}
_IDS_LOCK = threading.Lock()

Stamp = tuple[str, int, int, int]  # (name, inode, mtime_ns, size) of one batch file


def batch_name(ids: np.ndarray) -> str:
    """The file name of a batch: the same ids always give the same name."""
    return f"batch-{int(ids[0]):020d}-{len(ids)}-{zlib.crc32(ids.tobytes()):08x}.rows"


class RowStore:
    """The batch files of one collection (``directory`` is ``<collection>/rows``)."""

    def __init__(self, directory: Path, dim: int) -> None:
        self.directory, self.dim = Path(directory), dim

    def write(self, ids: np.ndarray, vectors: np.ndarray, fsync: bool = False) -> Path:
        """Store one batch atomically (temp file + rename); ``fsync`` also flushes it to the device."""
        final = self.directory / batch_name(ids)
        tmp = self.directory / f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as out:
                np.save(out, ids, allow_pickle=False)
                np.save(out, vectors, allow_pickle=False)
                if fsync:
                    out.flush()
                    os.fsync(out.fileno())
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        if fsync:
            descriptor = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(descriptor)  # the rename itself
            finally:
                os.close(descriptor)
        return final

    def listing(self) -> list[Stamp]:
        """Every complete batch file, in write order (modification time, then name)."""
        stamps = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if PATTERN.match(entry.name):
                    with contextlib.suppress(FileNotFoundError):  # replaced by a retry meanwhile
                        info = entry.stat()
                        stamps.append((entry.name, info.st_ino, info.st_mtime_ns, info.st_size))
        return sorted(stamps, key=lambda s: (s[2], s[0]))

    def ids(self, stamp: Stamp) -> np.ndarray:
        """The ids of one batch file (read once per file version in this process)."""
        key = (str(self.directory / stamp[0]), *stamp[1:])
        with _IDS_LOCK:
            cached = _IDS.get(key)
        if cached is None:
            with open(key[0], "rb") as f:
                cached = np.load(f, allow_pickle=False)
            with _IDS_LOCK:
                for old in [k for k in _IDS if k[0] == key[0]]:
                    del _IDS[old]  # an earlier version of the same file
                _IDS[key] = cached
        return cached

    def read(self, stamp: Stamp) -> tuple[np.ndarray, np.ndarray]:
        """(ids, vectors) of one batch file."""
        with open(self.directory / stamp[0], "rb") as f:
            ids = np.load(f, allow_pickle=False)
            vectors = np.load(f, allow_pickle=False)
        if vectors.shape != (len(ids), self.dim):
            raise ValueError(
                f"{self.directory / stamp[0]}: vectors {vectors.shape}, expected ({len(ids)}, {self.dim})"
            )
        return ids, vectors

    def newest(self, listing: list[Stamp]) -> list[np.ndarray]:
        """Per file of ``listing``, a mask of the rows that are the newest copy of their id."""
        ids = [self.ids(s) for s in listing]
        if not ids:
            return []
        every = np.concatenate(ids)
        # np.unique returns an id's first position; over the reversed order that is its newest copy.
        _, first_reversed = np.unique(every[::-1], return_index=True)
        keep = np.zeros(len(every), dtype=bool)
        keep[len(every) - 1 - first_reversed] = True
        return np.split(keep, np.cumsum([len(i) for i in ids])[:-1])

    def count(self, listing: list[Stamp] | None = None) -> int:
        """Distinct ids stored (and the ids cached for files no longer there are forgotten)."""
        listing = self.listing() if listing is None else listing
        current = {(str(self.directory / s[0]), *s[1:]) for s in listing}
        prefix = str(self.directory) + os.sep
        with _IDS_LOCK:
            for key in [k for k in _IDS if k[0].startswith(prefix) and k not in current]:
                del _IDS[key]
        if not listing:
            return 0
        return len(np.unique(np.concatenate([self.ids(s) for s in listing])))

    def chunks(self, listing: list[Stamp], rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every stored row once (its newest copy), as (ids, vectors) chunks of about ``rows`` rows."""
        ids_buf: list[np.ndarray] = []
        vec_buf: list[np.ndarray] = []
        held = 0
        for stamp, keep in zip(listing, self.newest(listing), strict=True):
            ids, vectors = self.read(stamp)
            if not keep.all():
                ids, vectors = ids[keep], vectors[keep]
            ids_buf.append(ids)
            vec_buf.append(vectors)
            held += len(ids)
            if held >= rows:
                yield np.concatenate(ids_buf), np.concatenate(vec_buf)
                ids_buf, vec_buf, held = [], [], 0
        if held:
            yield np.concatenate(ids_buf), np.concatenate(vec_buf)

    def sample(self, listing: list[Stamp], rows: int, seed: int) -> np.ndarray:
        """``rows`` distinct stored vectors drawn at random with ``seed`` (all of them when fewer)."""
        masks = self.newest(listing)
        total = int(sum(m.sum() for m in masks))
        rows = min(rows, total)
        chosen = np.sort(np.random.default_rng(seed).choice(total, size=rows, replace=False))
        out = np.empty((rows, self.dim), dtype=np.float32)
        position = filled = 0
        for stamp, keep in zip(listing, masks, strict=True):
            kept = int(keep.sum())
            lo, hi = np.searchsorted(chosen, [position, position + kept])
            if hi > lo:
                vectors = self.read(stamp)[1][keep]
                out[filled : filled + hi - lo] = vectors[chosen[lo:hi] - position]
                filled += hi - lo
            position += kept
        return out

    def data_bytes(self, listing: list[Stamp]) -> int:
        """Apparent bytes of the batch files."""
        return sum(s[3] for s in listing)
