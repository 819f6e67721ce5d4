"""The database pilot block: its own batch job, nodes, storage medium and images (pydantic only)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from apps.vdb import DATABASES, databases
from apps.vdb import database as declared
from core.config import Strict
from executors.config import StorageMedium, Walltime
from executors.safe import (
    DaosLabel,
    Directive,
    Interface,
    PbsFilesystem,
    PbsSelect,
    PlainText,
    SafePath,
    SchedulerName,
)


class DaosConfig(Strict):
    """A DAOS POSIX container mounted with dfuse on every database node (Aurora)."""

    pool: DaosLabel = Field(description="DAOS pool allocated to the project.")
    container: DaosLabel = Field(description="POSIX container in the pool.")
    mount: SafePath | None = Field(None, description="dfuse mount point; default /tmp/<pool>/<container>.")
    filesystem: PbsFilesystem = Field(
        "daos_user_fs", description="PBS filesystems entry that starts the DAOS agent."
    )
    setup: list[str] = Field(
        default_factory=lambda: ["module use /soft/modulefiles", "module load daos"],
        description="Shell lines before mounting (modules). Shell by design: copied verbatim into the "
        "job script, neither checked nor quoted.",
    )
    mount_command: str = Field(
        "launch-dfuse.sh {pool}:{container}",
        description="Command that mounts the container on every node of the job. Shell by design (like "
        "setup); {pool} and {container} are replaced by the checked labels.",
    )

    @property
    def mount_point(self) -> str:
        """Where the container is mounted on the nodes."""
        return self.mount or f"/tmp/{self.pool}/{self.container}"


class StorageConfig(Strict):
    """Where database workers keep their data (the study's storage-medium axis)."""

    medium: StorageMedium = Field("memory", description="memory (/dev/shm), ssd, lustre or daos.")
    memory_path: SafePath = Field("/dev/shm", description="tmpfs directory used for 'memory'.")
    ssd_path: SafePath | None = Field(None, description="Node-local SSD directory used for 'ssd'.")
    lustre_path: SafePath | None = Field(
        None, description="Directory on the parallel file system used for 'lustre' (must exist)."
    )
    daos: DaosConfig | None = Field(None, description="The DAOS container used for 'daos'.")
    cleanup: bool = Field(True, description="Remove node-local data (memory, ssd) when a rank stops.")

    def base_dir(self) -> str | None:
        """The directory the chosen medium stores under (None when not configured)."""
        if self.medium == "memory":
            return self.memory_path
        if self.medium == "ssd":
            return self.ssd_path
        if self.medium == "lustre":
            return self.lustre_path
        return self.daos.mount_point if self.daos else None

    @property
    def shared(self) -> bool:
        """True when every node sees the same files (needed by Milvus distributed across nodes)."""
        return self.medium in ("lustre", "daos")


def _known_images(images: dict[str, str]) -> dict[str, str]:
    """Image names come from the registered databases (each declares its own ``images``)."""
    known = {name for db in databases() for name in db.images}
    unknown = sorted(set(images) - set(known))
    if unknown:
        raise ValueError(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return images


def _known_databases(overrides: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(DATABASES))
    if unknown:
        raise ValueError(f"unknown database(s) {', '.join(unknown)}; known: {', '.join(sorted(DATABASES))}")
    return overrides


ImagesConfig = Annotated[dict[str, SafePath], AfterValidator(_known_images)]


class MilvusClusterConfig(Strict):
    """Milvus layout: one standalone process, or the distributed roles on a shared file system."""

    mode: Literal["standalone", "distributed"] = Field(
        "standalone", description="standalone: one process with embedded etcd; distributed: roles below."
    )
    proxies: int = Field(1, ge=1, description="Proxy processes (clients are spread over them).")
    streaming_nodes: int = Field(1, ge=1, description="Streaming nodes (ingest, WAL).")
    query_nodes: int = Field(1, ge=1, description="Query nodes (search over sealed segments).")
    data_nodes: int = Field(1, ge=1, description="Data nodes (flush, compaction, index builds).")

    @property
    def ranks(self) -> int:
        """Processes the layout runs (standalone: 1; distributed: etcd + mixcoord + the roles)."""
        if self.mode == "standalone":
            return 1
        return 2 + self.proxies + self.streaming_nodes + self.query_nodes + self.data_nodes


class ClusterOverride(Strict):
    """Settings of the database block that differ for one database (unset fields keep the block's)."""

    nodes: int | None = Field(None, ge=1, description="Nodes of this database's job.")
    workers: int | None = Field(None, ge=1, description="Ranks of this database.")
    workers_per_node: int | None = Field(None, ge=1, le=4, description="Ranks per node (at most 4).")
    cores_per_worker: int | None = Field(None, ge=1, description="Physical cores bound to each rank.")
    gpu_indexing: bool | None = Field(None, description="Qdrant: GPU HNSW build.")
    shards_per_worker: int | None = Field(None, ge=1, description="Collection shards per worker.")
    storage: StorageConfig | None = Field(None, description="Where this database's ranks keep data.")
    milvus: MilvusClusterConfig | None = Field(None, description="Milvus layout (milvus only).")


class DatabaseClusterConfig(Strict):
    """The database pilot block: its own batch job and nodes; clients run on other nodes."""

    nodes: int = Field(1, ge=1, description="Nodes of the database job.")
    workers: int = Field(
        1,
        ge=1,
        description="Database server processes (ranks). Milvus distributed: etcd + mixcoord + roles.",
    )
    workers_per_node: int = Field(1, ge=1, le=4, description="Ranks per node (at most 4, as in the study).")
    cores_per_worker: int = Field(8, ge=1, description="Physical cores bound to each rank (one socket).")
    bind: Literal["cores", "none"] = Field(
        "cores",
        description="cores: the launcher binds each rank to its cores (mpiexec/srun --cpu-bind); none: no "
        "binding, GOMAXPROCS still cores_per_worker x threads per core. Same meaning as vdb.bind locally.",
    )
    gpu_indexing: bool = Field(False, description="Qdrant: GPU HNSW build (GPU image, apptainer --nv).")
    shards_per_worker: int = Field(
        1, ge=1, description="Collection shards per worker: vdb.collection.shards must equal workers x this."
    )
    storage: StorageConfig = Field(default_factory=StorageConfig, description="Where ranks keep data.")
    images: ImagesConfig = Field(
        default_factory=dict,
        description="Apptainer images (.sif built from the vendors' Docker images), by name: "
        + "; ".join(f"{name}: {text}" for db in databases() for name, text in db.images.items()),
    )
    milvus: MilvusClusterConfig = Field(
        default_factory=MilvusClusterConfig, description="Milvus standalone or distributed roles."
    )
    interface: Interface | None = Field(
        None, description="Interface whose IPv4 address ranks advertise (hsn0); None: hostname -i."
    )
    runtime: Literal["apptainer", "native"] = Field(
        "apptainer",
        description="How a rank runs its server: apptainer (images, as on Polaris and Aurora) or native "
        "(executables on the nodes' file system; the local Slurm testbed, or a site without Apptainer).",
    )
    executables: Annotated[dict[str, SafePath], AfterValidator(_known_databases)] = Field(
        default_factory=dict,
        description="runtime native: server executable by database (weaviate: weaviate-server). Milvus "
        "standalone runs the binary bundled with the `milvus` Python package and needs none.",
    )
    launcher: Literal["mpiexec", "srun", "local"] = Field(
        "mpiexec", description="How ranks start on the job's nodes; local: one node, no MPI (tests)."
    )
    apptainer: SafePath = Field("apptainer", description="Apptainer executable on the compute nodes.")
    fakeroot: bool | None = Field(
        None,
        description="apptainer exec --fakeroot; None: the platform's default (executor.node."
        "apptainer_fakeroot: on at ALCF, whose compute nodes need it).",
    )
    apptainer_args: list[PlainText] = Field(
        default_factory=list,
        description="Extra apptainer exec arguments (e.g. --bind /lus); each is one word, quoted in the "
        "rank scripts.",
    )
    base_port: int = Field(
        20000, ge=1024, le=65000, description="First port; rank r uses base_port + r x port_stride onward."
    )
    port_stride: int = Field(10, ge=6, le=100, description="Ports reserved per rank.")
    queue: SchedulerName | None = Field(
        None, description="Queue of the database job; default: executor.queue."
    )
    walltime: Walltime | None = Field(None, description="Walltime of the database job; default: executor's.")
    select_options: PbsSelect | None = Field(
        None, description="PBS select options; default: executor.select_options."
    )
    scheduler_options: list[Directive] = Field(
        default_factory=list,
        description="Extra directive lines for the database job (#PBS or #SBATCH, as the platform).",
    )
    worker_init: list[str] = Field(
        default_factory=lambda: ["module load apptainer"],
        description="Shell lines run on the database job before the ranks start. Shell by design: copied "
        "verbatim into the job script, neither checked nor quoted.",
    )
    driver_lease_s: float = Field(
        300,
        ge=0,
        description="Ranks stop when the driver has not renewed its lease (registry/LEASE) for this long, "
        "so a driver that died does not leave them running until walltime; 0: no lease.",
    )
    startup_timeout_s: float = Field(
        900, gt=0, description="Seconds a rank waits for its server (and for rank 0) to be healthy."
    )
    telemetry: bool = Field(
        True,
        description="Each rank samples its server once a second (python -m apps.telemetry, with the "
        "driver's Python, on the host beside the container) into <cluster>/telemetry/rank-NNN.parquet; "
        "merged into the point's telemetry.parquet after teardown.",
    )
    overrides: Annotated[dict[str, ClusterOverride], AfterValidator(_known_databases)] = Field(
        default_factory=dict,
        description="Per-database changes, e.g. milvus distributed on Lustre while Qdrant runs in memory.",
    )

    def for_database(self, name: str) -> DatabaseClusterConfig:
        """This block with ``overrides[name]`` applied (the block itself when there is none)."""
        override = self.overrides.get(name)
        if override is None:
            return self
        changes = {
            k: getattr(override, k) for k in override.model_fields_set if getattr(override, k) is not None
        }
        return self.model_copy(update=changes)

    def field_path(self, name: str, field: str) -> tuple:
        """Path of ``field`` as the user wrote it: under overrides.<name> when overridden there."""
        override = self.overrides.get(name)
        if override is not None and field in override.model_fields_set:
            return ("vdb", "cluster", "overrides", name, field)
        return ("vdb", "cluster", field)

    @model_validator(mode="after")
    def _ports_fit(self) -> DatabaseClusterConfig:
        last = self.base_port + self.workers * self.port_stride
        if last > 65535:
            raise ValueError(
                f"ports base_port + workers x port_stride = {last} exceed 65535; lower base_port"
            )
        return self


def image_for(cluster: DatabaseClusterConfig, database: str, settings: Any = None) -> tuple[str, str | None]:
    """(images field name, path) of the image a database runs from (the database picks the field, from
    its ``settings`` too when given)."""
    field = declared(database).image_for(cluster, settings)
    return field, cluster.images.get(field)
