"""Rank layout of a database cluster: which process runs where, on which cores and ports, with which data.

Pure planning, no side effects: :func:`plan_cluster` asks the database's own ``ranks`` (in its declaration,
found through the registry in :mod:`apps.vdb`) for its ranks, then places them on node slots and binds
cores. Ranks learn their own address at run time (the configured interface), so the only cross-rank value a
rank needs, rank 0's address, is read from the registry rather than guessed from host names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.vdb import database as declared
from apps.vdb.base import DatabaseError
from apps.vdb.cluster.config import DatabaseClusterConfig, image_for
from apps.vdb.cluster.native import native_spec
from apps.vdb.cluster.spec import RankSpec
from executors.config import NodeShape, bind_lists

REGISTRY = "registry"
STOP_FILE = "STOP"
LEASE_FILE = "LEASE"  # renewed by the driver; ranks stop when it goes stale
CLUSTER_DIR = "cluster"


@dataclass
class ClusterLayout:
    """Every rank of one database cluster and where its scripts, registry and data live."""

    database: str
    cluster_id: str
    directory: Path  # scripts, registry and logs (shared file system)
    data_root: str  # per-rank data lives under it
    ranks: list[RankSpec]
    entry_ranks: list[int]  # ranks clients connect to, preferred first
    shared_data: str | None = None  # Milvus distributed: the directory every rank shares

    @property
    def registry(self) -> Path:
        """The directory where every rank records its state, host and ports."""
        return self.directory / REGISTRY

    def to_json(self) -> dict[str, Any]:
        """The plan as data (rank -> role, slot, cores, ports), for ``plan`` and provenance."""
        return {
            "database": self.database,
            "cluster_id": self.cluster_id,
            "directory": str(self.directory),
            "ranks": [
                {
                    "rank": r.rank,
                    "role": r.role,
                    "node_slot": r.node_slot,
                    "cores": core_ranges(r.cores),
                    "ports": r.ports,
                    "data_dir": r.data_dir,
                }
                for r in self.ranks
            ],
            "entry_ranks": self.entry_ranks,
        }


def cluster_id_for(database: str, workdir: Path) -> str:
    """A short, stable id: the same deployment directory always gets the same data directories."""
    digest = hashlib.sha1(str(workdir).encode()).hexdigest()[:8]
    return f"{database}-{digest}"


def rank_ports(cluster: DatabaseClusterConfig, rank: int, names: list[str]) -> dict[str, int]:
    """Distinct ports for every rank: rank r owns base_port + r*stride ... + stride-1."""
    first = cluster.base_port + rank * cluster.port_stride
    return {name: first + i for i, name in enumerate(names)}


def common_env(cluster: DatabaseClusterConfig) -> dict[str, str]:
    """Environment every Go server rank gets (Weaviate, Milvus).

    Go servers do not follow CPU affinity; GOMAXPROCS caps them (set to the hardware threads each rank is
    bound to by :func:`plan_cluster`, once cores are bound).
    """
    return {"GOMAXPROCS": str(cluster.cores_per_worker)}


def in_memory(cluster: DatabaseClusterConfig, path: str) -> str:
    """``path`` (under the storage medium's directory) moved to the memory medium: etcd's small, fsync-heavy
    data lives in tmpfs whatever the medium, never on Lustre or a DAOS dfuse mount."""
    base = (cluster.storage.base_dir() or "").rstrip("/")
    relative = path[len(base) :] if base and path.startswith(base) else "/" + path.lstrip("/")
    return cluster.storage.memory_path.rstrip("/") + relative


def node_shape(executor: Any) -> NodeShape:
    """The executor's node shape (the local platform: this machine, unbound)."""
    return getattr(executor, "node", None) or NodeShape(sockets=1, cores_per_socket=1, gpus=0)


def plan_cluster(
    settings: Any,
    cluster: DatabaseClusterConfig,
    node: NodeShape,
    workdir: Path,
    base_dir: Path | None = None,
    rerunnable: bool = False,
) -> ClusterLayout:
    """Lay out every rank of ``settings.name`` on the cluster block (no side effects).

    ``rerunnable``: the job may be preempted and rerun (``executors.providers.rerunnable``), so its data
    directory does not name the job and the rerun finds the data the killed run left.
    """
    database = settings.name
    cluster = cluster.for_database(database)
    cid = cluster_id_for(database, workdir)
    storage_base = cluster.storage.base_dir()
    if not storage_base:
        raise DatabaseError(
            f"vdb.cluster.storage: medium {cluster.storage.medium} has no directory configured"
        )
    # One data directory per scheduler job (lib.sh sets VDB_JOB): a retry never sees stale state; a
    # preempted job's rerun keeps the one directory instead.
    job = "rerunnable" if rerunnable else "job-${VDB_JOB}"
    data = f"{storage_base.rstrip('/')}/pes2o-vdb/{cid}/{job}"
    directory = Path(workdir) / CLUSTER_DIR
    native = cluster.runtime == "native"
    if native:
        executable = cluster.executables.get(database)
        image = str(absolute(executable, base_dir)) if executable else ""
    else:
        _, image = image_for(cluster, database, settings)
        if not image:
            raise DatabaseError(f"vdb.cluster.images: no Apptainer image for {database}")
        image = str(absolute(image, base_dir))
    planned = declared(database).plan_ranks(settings, cluster, image, data, base_dir)
    ranks = planned.ranks
    if native and not planned.native:
        if not image:
            raise DatabaseError(
                f"vdb.cluster.executables.{database}: runtime native needs the server executable"
            )
        ranks = [native_spec(spec, image, directory) for spec in ranks]
    bound = cluster.bind == "cores"
    # Where each node-local rank sits; an unbound rank is not pinned there, but its GPU is still the one
    # nearest those cores (ALCF's per-rank GPU choice on Polaris is by position, not binding).
    places = bind_lists(node, cluster.workers_per_node, cluster.cores_per_worker) or []
    fakeroot = node.apptainer_fakeroot if cluster.fakeroot is None else cluster.fakeroot
    for spec in ranks:
        spec.node_slot, spec.local_index = divmod(spec.rank, cluster.workers_per_node)
        place = places[spec.local_index] if spec.local_index < len(places) else []
        spec.cores = place if bound else []
        if fakeroot and cluster.runtime == "apptainer":
            spec.apptainer_flags.insert(0, "--fakeroot")
        if "GOMAXPROCS" in spec.env:  # Go ignores CPU affinity: as many threads as it is bound to
            threads = len(hw_threads(spec.cores, node)) or cluster.cores_per_worker * node.threads_per_core
            spec.env["GOMAXPROCS"] = str(threads)
        if cluster.gpu_indexing and node.gpus:
            # One GPU per rank; the env file reaches the server through apptainer --cleanenv.
            spec.env["CUDA_VISIBLE_DEVICES"] = str(node.nearest_gpu(place, spec.local_index))
    return ClusterLayout(database, cid, directory, data, ranks, planned.entry_ranks, planned.shared_data)


def absolute(path: str, base_dir: Path | None) -> Path:
    """``path`` with ~ expanded, a relative one resolved against the config's directory ``base_dir``."""
    p = Path(path).expanduser()
    return p if p.is_absolute() or base_dir is None else (base_dir / p).resolve()


def core_ranges(cores: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3,7'."""
    parts: list[str] = []
    for c in sorted(cores):
        if parts and c == int(parts[-1].split("-")[-1]) + 1:
            start = parts[-1].split("-")[0]
            parts[-1] = f"{start}-{c}"
        else:
            parts.append(str(c))
    return ",".join(parts)


def hw_threads(cores: list[int], node: NodeShape) -> list[int]:
    """Physical cores plus their hyper-thread siblings (sibling of core c is c + cores per node)."""
    return sorted(c + t * node.cores for c in cores for t in range(node.threads_per_core))
