"""FAISS's deployment: nothing to start. It only owns the data dir the clients share through the disk."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from apps.vdb.base import Deployment, Endpoints
from apps.vdb.faiss.build import LOADED
from apps.vdb.faiss.settings import FaissSettings


class FaissDeployment(Deployment):
    """Publishes in-process endpoints whose ``data_dir`` holds the collections (row store and index)."""

    name = "faiss"

    def __init__(self, settings: FaissSettings) -> None:
        self.settings = settings
        self.data_dir: Path | None = None

    def start(self, workdir: Path, timeout: float = 120.0) -> Endpoints:
        """Create ``<workdir>/faiss`` and return endpoints without nodes (the library runs in the clients)."""
        self.data_dir = Path(workdir) / "faiss"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return Endpoints(
            database="faiss",
            nodes=[],
            data_dir=str(self.data_dir),
            in_process=True,
            server_version=f"faiss-cpu {importlib.metadata.version('faiss-cpu')}",
        )

    def stop(self) -> None:
        """Forget the indexes this process loaded from the data dir (the files stay, as a server's would)."""
        if self.data_dir is not None:
            LOADED.drop(str(self.data_dir) + os.sep)
