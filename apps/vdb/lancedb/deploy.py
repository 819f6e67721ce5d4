"""LanceDB's deployment: nothing to start; it picks the data directory on the chosen medium.

LanceDB is a library: the engine runs in the client process (``Endpoints.in_process``), and the
deployment only decides where the tables live. The directory is created by the client that opens it
(on HPC the deploy task runs on the driver, which may not see a client node's local disk).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
from pathlib import Path

from apps.vdb.base import Deployment, Endpoints
from apps.vdb.lancedb.settings import LanceDBSettings

SHM = "/dev/shm"  # medium memory without a data_path


def data_directory(settings: LanceDBSettings, workdir: Path) -> Path:
    """Where this deployment's tables live.

    Default: ``<workdir>/lancedb`` (the run's data directory). With ``data_path`` (or medium memory), a
    subdirectory named after the workdir, so two runs sharing one data_path never meet.
    """
    base = settings.data_path or (SHM if settings.medium == "memory" else None)
    if base is None:
        return Path(workdir).resolve() / "lancedb"
    digest = hashlib.sha256(str(Path(workdir).resolve()).encode()).hexdigest()[:12]
    return Path(base).expanduser().resolve() / f"lancedb-{digest}"


class LanceDBDeployment(Deployment):
    """Publishes in-process endpoints naming the data directory; starts nothing."""

    name = "lancedb"

    def __init__(self, settings: LanceDBSettings) -> None:
        self.settings = settings
        self.data_dir: Path | None = None

    def start(self, workdir: Path, timeout: float = 120.0) -> Endpoints:
        """Endpoints with ``in_process=True`` and ``data_dir``; a leftover of this workdir is removed."""
        self.data_dir = data_directory(self.settings, workdir)
        if self.data_dir.exists():  # an earlier attempt of this same stage directory: start clean
            shutil.rmtree(self.data_dir)
        version = f"lancedb {importlib.metadata.version('lancedb')}"
        return Endpoints(
            database="lancedb",
            nodes=[],
            data_dir=str(self.data_dir),
            in_process=True,
            server_version=version,
        )

    def stop(self) -> None:
        """Nothing runs. The tables stay on disk, except on medium memory (``/dev/shm`` holds RAM) when
        this machine sees them."""
        if self.settings.medium == "memory" and self.data_dir is not None and self.data_dir.exists():
            shutil.rmtree(self.data_dir, ignore_errors=True)
