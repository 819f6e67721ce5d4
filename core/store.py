"""Content-addressed artifacts: keys, atomic writes and manifests.

A stage output lives in a directory named by its content key: the hash of the upstream keys, the
stage's parameters and its version. Every file is written to a temporary name and renamed into place;
``manifest.json`` is written last. So a directory without a manifest that verifies is never taken as
complete, and resume is "skip whatever has a verified manifest".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from core.errors import ArtifactError, describe

MANIFEST = "manifest.json"
KEY_LENGTH = 16  # hex digits of sha256 kept in directory names (64 bits)
# A name that becomes a folder or a run id: no separator, no hidden or temporary folder (`.x`, `..`).
SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
SAFE_NAME_RULE = "a letter or digit, then letters, digits, '.', '_' and '-'"


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the input of every hash."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def content_key(stage: str, version: str, params: Any, upstream: Iterable[str] = ()) -> str:
    """The content key of a stage output: hash of stage name, version, parameters and upstream keys."""
    payload = canonical_json(
        {"stage": stage, "version": version, "params": params, "upstream": list(upstream)}
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:KEY_LENGTH]


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 hex digest of a file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _temp_beside(path: Path) -> Path:
    """A new empty file beside ``path``, to fill and rename onto it: mode 0o666 less the umask, as any
    ``open`` makes (``mkstemp``'s 0o600 would hide datasets and reports from a project's other members)."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # less the umask
            return tmp
        except FileExistsError:
            continue


def _publish(tmp: Path, path: Path) -> None:
    """fsync then rename: after a crash the file is either whole or absent."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def ensure_writable_dir(path: Path) -> None:
    """Create ``path`` (with parents) and write and remove a probe file in it; OSError when that fails.

    A probe, not ``os.access``: access() says yes to root on a read-only mount, and a path under a
    regular file fails only when something is created.
    """
    path.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".probe.", dir=path)
    os.close(fd)
    os.unlink(name)


def uncreatable_reason(path: Path) -> str | None:
    """Why the directory ``path`` could not be made or written, told without creating anything (for
    ``validate`` and ``plan``): a file in the way, or its nearest existing folder not writable. None when
    nothing says so; :func:`ensure_writable_dir`'s probe, when the run writes, has the last word."""
    nearest = _nearest_existing(path)
    if nearest is None:
        return None
    if not nearest.is_dir():
        return f"{nearest} is a file, not a directory"
    if not os.access(nearest, os.W_OK | os.X_OK):
        return f"{nearest}: permission denied"
    return None


def os_error_reason(exc: OSError, path: Path) -> str:
    """Why ``path`` could not be created or written, for a one-line message."""
    nearest = _nearest_existing(path)
    # ENOTDIR, or EEXIST from mkdir of a path that is a file: name the file in the way.
    if exc.errno in (errno.ENOTDIR, errno.EEXIST) and nearest is not None and not nearest.is_dir():
        return f"{nearest} is a file, not a directory"
    return exc.strerror or str(exc)


def _nearest_existing(path: Path) -> Path | None:
    """``path`` or its closest ancestor that exists (what a mkdir -p of ``path`` runs into)."""
    return next((parent for parent in [path, *path.parents] if parent.exists()), None)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        _publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_json(path: Path, value: Any) -> None:
    """Write ``value`` as indented JSON atomically."""
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def write_parquet_atomic(
    table: pa.Table, path: Path, *, row_group_rows: int = 4096, metadata: dict[str, str] | None = None
) -> dict[str, Any]:
    """Write a zstd Parquet file atomically; return ``{rows, bytes, sha256}`` of what was written.

    ``metadata`` goes into the file's key-value metadata (model, dimension, chunker, ...).
    The writer is configured so the same table gives the same bytes on every run.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    tmp = _temp_beside(path)
    try:
        pq.write_table(
            table,
            tmp,
            compression="zstd",
            row_group_size=row_group_rows,
            write_statistics=True,
            use_dictionary=False,
            write_page_checksum=True,  # a part overwritten in place fails its read (open_parquet)
        )
        _publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return {"rows": table.num_rows, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def file_entry(path: Path, name: str) -> dict[str, Any]:
    """A manifest's ``files`` entry for ``path``, listed as ``name`` (relative to the manifest's folder):
    what :func:`verify_files` checks (its size) and ``checksums=True`` checks too (its sha256)."""
    return {"file": name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a stage directory, or None when there is none (the stage is not complete).

    ArtifactError naming the file when it is there but damaged (cut short, overwritten): it was written
    atomically, so something outside the pipeline changed it, and guessing what the stage holds is not
    safe. Deleting it has the stage redone (keeping the shards whose records still verify).
    """
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):  # under a file: absent too (writing will say why)
        return None
    except json.JSONDecodeError as exc:
        raise ArtifactError(_damaged(path, f"not valid JSON at line {exc.lineno}")) from None
    except UnicodeDecodeError:
        raise ArtifactError(_damaged(path, "not UTF-8 text")) from None
    except OSError as exc:  # a directory in its place, another user's unreadable file
        raise ArtifactError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(_damaged(path, f"a JSON {type(manifest).__name__}, not an object"))
    if not isinstance(manifest.get("files", []), list):
        raise ArtifactError(_damaged(path, "'files' is not a list"))
    return manifest


def _damaged(path: Path, why: str) -> str:
    return f"{path}: damaged manifest ({why}); delete it and run again to have the stage redone"


def open_parquet(path: Path | str) -> pq.ParquetFile:
    """A Parquet file of the store, whose pages' CRCs are checked as they are read: stored values are
    incompressible floats, so zstd keeps them raw and damage to them would otherwise read as other
    numbers. Pages written without a CRC (before write_parquet_atomic wrote them) are read unchecked.
    Use it inside :func:`naming_damage`."""
    return pq.ParquetFile(path, page_checksum_verification=True)


def read_store_table(path: Path | str, columns: list[str] | None = None) -> pa.Table:
    """A Parquet file of the store, read whole (``columns`` of it), its page CRCs checked and damage
    named (:func:`open_parquet`, :func:`naming_damage`)."""
    with naming_damage(Path(path)):
        return open_parquet(path).read(columns=columns)


def read_store_row_group(path: Path | str, group: int, columns: list[str]) -> pa.Table:
    """One row group of a Parquet file of the store (``columns`` of it), checked and named as
    :func:`read_store_table` reads a whole file: a worker's unit of work, read without the rest."""
    with naming_damage(Path(path)):
        return open_parquet(path).read_row_group(group, columns=columns)


@contextlib.contextmanager
def naming_damage(path: Path) -> Iterator[None]:
    """Reading ``path``: a read error becomes an ArtifactError naming the file and the remedy.

    A store file of the right size can still be damaged (overwritten in place): completeness checks
    read sizes only, since hashing 800 GB of parts at every ``plan`` is not affordable. So the reader is
    where damage shows, and pyarrow's own words (``ZSTD decompression failed``) name no file.
    """
    try:
        yield
    except FileNotFoundError:  # removed since the plan found it complete
        raise ArtifactError(
            f"{path}: missing (removed during the run?); run again to have it made again"
        ) from None
    except (pa.ArrowException, OSError) as exc:
        raise ArtifactError(
            f"{path}: cannot be read ({describe(exc)}); if it was damaged after it was written, delete it "
            "and run again to have it made again"
        ) from None


def verify_files(directory: Path, files: list[dict[str, Any]], *, checksums: bool = False) -> list[str]:
    """Problems with the files a manifest lists (missing, wrong size, wrong sha256); empty when fine."""
    problems = []
    for number, entry in enumerate(files):
        if not _file_entry(entry):
            problems.append(f"{directory / MANIFEST}: files[{number}] is not a {{file, bytes}} entry")
            continue
        path = directory / entry["file"]
        if not path.exists():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != entry["bytes"]:
            problems.append(f"{path}: {path.stat().st_size} bytes, manifest says {entry['bytes']}")
        elif checksums and sha256_file(path) != entry["sha256"]:
            problems.append(f"{path}: sha256 differs from the manifest")
    return problems


def _file_entry(entry: Any) -> bool:
    """Whether a manifest's ``files`` entry names a file and its size (what verification reads)."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("file"), str)
        and isinstance(entry.get("bytes"), int)
        and not isinstance(entry["bytes"], bool)
    )


def complete_manifest(directory: Path, *, checksums: bool = False) -> dict[str, Any] | None:
    """The manifest if it exists and every file it lists verifies; otherwise None."""
    manifest = read_manifest(directory)
    if manifest is None or verify_files(directory, manifest.get("files", []), checksums=checksums):
        return None
    return manifest


def shard_record_path(directory: Path, file_name: str) -> Path:
    """Sidecar that marks one shard file of a stage complete (written after the file itself)."""
    return directory / "_shards" / f"{file_name}.json"


def read_shard_record(directory: Path, file_name: str) -> dict[str, Any] | None:
    """The record of a finished shard if its file is present with the recorded size, else None."""
    record = _shard_record(shard_record_path(directory, file_name))
    if record is None or verify_files(directory, [record]):
        return None
    return record


def _shard_record(path: Path) -> dict[str, Any] | None:
    """A shard record as written; None when absent or damaged (the shard is then simply redone)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: JSON or UTF-8 damage
        return None
    return record if _file_entry(record) else None


def shard_progress(directory: Path) -> tuple[int, list[str]]:
    """How many shards of a sharded stage are done, and a line per shard that was done but no longer
    verifies (``part-00003.parquet: 776214 bytes, manifest says 1552901``): those are redone by a run."""
    done, damaged = 0, []
    for path in sorted(directory.glob("_shards/*.json")):
        record = _shard_record(path)
        if record is None:
            damaged.append(f"{path}: damaged record")
        elif problems := verify_files(directory, [record]):
            damaged.extend(problems)
        else:
            done += 1
    return done, damaged


def write_shard_record(directory: Path, record: dict[str, Any]) -> None:
    """Mark a shard file complete; ``record`` has at least file, rows, bytes and sha256."""
    atomic_write_json(shard_record_path(directory, record["file"]), record)


@contextlib.contextmanager
def staged_directory(final: Path) -> Iterator[Path]:
    """A new folder beside ``final`` to fill; renamed onto ``final`` when the block ends without an
    error, removed when it raises. Whoever looks at ``final`` sees nothing or all of it.

    The folder is created with mode 0o755 less the umask (``mkdtemp``'s 0o700 would hide a store entry
    from its other users). ``final`` may exist as an empty folder (rename replaces it); when it holds
    something by then (another writer won) the rename's OSError (ENOTEMPTY or EEXIST) is raised and the
    staged folder removed.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = final.parent / f".{final.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.mkdir(tmp, 0o755)  # the kernel applies the umask: no process-wide umask() dance
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed) for the block; waits for it.

    Yields True when locked, False on a file system that refuses locks (some parallel ones): the block
    then runs unlocked and must tolerate a concurrent writer. The lock file is left in place (removing
    it would let a waiter lock an unlinked file). Another user's lock file on a shared workdir is opened
    read-only: ``flock`` needs no write access.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle = path.open("a")
    except PermissionError:
        handle = path.open("r")
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            locked = True
        except OSError:  # ENOLCK / EOPNOTSUPP: the block's errors must not chain onto this one
            locked = False
        try:
            yield locked
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)
