"""HPC platform models (Polaris, Aurora, Slurm sites) and the database-cluster pilot block.

Everything site- or user-specific (account, queue, file systems, paths, images) comes from the YAML file;
the defaults below are only facts about the machines (cores, GPUs, the interface ALCF documents).
Cross-field problems that need several sections at once (a queue's node limits, image files, storage
media a platform offers) are reported by :func:`check_platform` as ``(field path, message)`` pairs.

This module must not import :mod:`pipeline.config` (that module imports this one for its unions).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

# --- small types -------------------------------------------------------------------------------------------

_WALLTIME = re.compile(r"^(\d{1,3}):([0-5]\d):([0-5]\d)$")
_AFFINITY = re.compile(r"^(none|block|block-reverse|alternating|list:[0-9,\-:]+)$")


def _check_walltime(value: str) -> str:
    if not _WALLTIME.match(value):
        raise ValueError(f"walltime must be HH:MM:SS, e.g. 01:00:00 (got {value!r})")
    return value


def _check_affinity(value: str) -> str:
    if not _AFFINITY.match(value):
        raise ValueError(
            "cpu_affinity must be none, block, block-reverse, alternating or list:<cores>:<cores>... "
            f"(got {value!r})"
        )
    return value


Walltime = Annotated[str, AfterValidator(_check_walltime)]
CpuAffinity = Annotated[str, AfterValidator(_check_affinity)]
StorageMedium = Literal["memory", "ssd", "lustre", "daos"]
CheckpointMode = Literal["task_exit", "periodic", "dfk_exit", "manual"]

# Parsl launches one worker per entry; Aurora exposes 6 GPUs x 2 tiles as '<gpu>.<tile>'.
AURORA_TILES = [f"{gpu}.{tile}" for gpu in range(6) for tile in range(2)]
# ALCF's documented affinity for 12 tile workers: 8 cores (+ hyper-threads) each, skipping reserved 0 and 52.
AURORA_TILE_AFFINITY = (
    "list:1-8,105-112:9-16,113-120:17-24,121-128:25-32,129-136:33-40,137-144:41-48,145-152"
    ":53-60,157-164:61-68,165-172:69-76,173-180:77-84,181-188:85-92,189-196:93-100,197-204"
)


def walltime_seconds(value: str) -> int:
    """Seconds in an HH:MM:SS walltime."""
    match = _WALLTIME.match(value)
    if not match:
        raise ValueError(f"not an HH:MM:SS walltime: {value!r}")
    hours, minutes, seconds = (int(g) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


class HpcStrict(BaseModel):
    """Base for every HPC section: unknown keys are an error, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --- machine facts -----------------------------------------------------------------------------------------


class NodeShape(HpcStrict):
    """What one compute node has; used to pin workers to cores of one socket."""

    sockets: int = Field(1, ge=1, description="CPU sockets per node.")
    cores_per_socket: int = Field(32, ge=1, description="Physical cores per socket.")
    threads_per_core: int = Field(2, ge=1, description="Hardware threads per physical core.")
    gpus: int = Field(4, ge=0, description="GPUs per node.")
    reserved_cores: list[int] = Field(
        default_factory=list,
        description="Physical cores the site reserves for the OS (Aurora: 0 and 52); never bound.",
    )

    @property
    def cores(self) -> int:
        """Physical cores per node."""
        return self.sockets * self.cores_per_socket


class QueueLimits(HpcStrict):
    """What one queue accepts (from the site's documentation); checked at plan time."""

    min_nodes: int = Field(1, ge=1, description="Smallest job (nodes) the queue accepts.")
    max_nodes: int = Field(ge=1, description="Largest job (nodes) the queue accepts.")
    max_walltime: Walltime | None = Field(None, description="Longest walltime the queue accepts (HH:MM:SS).")


# --- Parsl blocks ------------------------------------------------------------------------------------------


class GpuWorkers(HpcStrict):
    """GPU HighThroughputExecutor (label 'workers'): embedding, ground truth; one worker per GPU or tile."""

    nodes_per_block: int = Field(1, ge=1, description="Nodes per batch job (one Parsl block).")
    init_blocks: int = Field(1, ge=0, description="Blocks submitted when the run starts.")
    min_blocks: int = Field(0, ge=0, description="Blocks kept even when idle.")
    max_blocks: int = Field(1, ge=1, description="Most blocks (batch jobs) at once.")
    accelerators: int | list[str] = Field(
        4,
        description="GPUs a node offers to workers: a count (ids 0..n-1) or explicit ids such as Aurora "
        "tiles '0.0'; Parsl starts one worker per entry and pins it (CUDA_VISIBLE_DEVICES, "
        "ZE_AFFINITY_MASK).",
    )
    cores_per_worker: float = Field(8, gt=0, description="CPU hardware threads per worker.")
    cpu_affinity: CpuAffinity = Field(
        "block-reverse",
        description="Parsl worker CPU pinning: block, block-reverse (Polaris: GPU 0 is near the last "
        "cores), alternating, or an explicit list:<cores>:<cores>... per worker.",
    )
    prefetch_capacity: int = Field(
        0, ge=0, description="Tasks prefetched beyond free workers (0: best balance for long tasks)."
    )
    bind_cmd: str = Field("--cpu-bind", description="MpiExecLauncher option that binds the manager.")
    launcher_overrides: str = Field(
        "--depth=64 --ppn 1",
        description="Extra mpiexec arguments: one manager per node (--ppn 1) owning all cores.",
    )
    queue: str | None = Field(None, description="Queue for this block; default: executor.queue.")
    walltime: Walltime | None = Field(None, description="Walltime of this block; default: executor.walltime.")
    select_options: str | None = Field(
        None, description="PBS select options of this block; default: executor.select_options."
    )

    @property
    def accelerator_ids(self) -> list[str]:
        """The accelerator ids as Parsl names them."""
        if isinstance(self.accelerators, int):
            return [str(i) for i in range(self.accelerators)]
        return list(self.accelerators)


class CpuWorkers(HpcStrict):
    """CPU HighThroughputExecutor (label 'cpu'): chunking and database clients, on their own nodes."""

    nodes_per_block: int = Field(1, ge=1, description="Nodes per batch job.")
    init_blocks: int = Field(0, ge=0, description="Blocks submitted when the run starts (0: on demand).")
    min_blocks: int = Field(0, ge=0, description="Blocks kept even when idle.")
    max_blocks: int = Field(1, ge=1, description="Most blocks at once.")
    workers_per_node: int = Field(8, ge=1, description="Worker processes per node.")
    cores_per_worker: float = Field(4, gt=0, description="CPU hardware threads per worker.")
    cpu_affinity: CpuAffinity = Field("block", description="Parsl worker CPU pinning (see the GPU block).")
    bind_cmd: str = Field("--cpu-bind", description="Launcher option that binds the manager.")
    launcher_overrides: str = Field("--depth=64 --ppn 1", description="Extra launcher arguments.")
    queue: str | None = Field(None, description="Queue for this block; default: executor.queue.")
    walltime: Walltime | None = Field(None, description="Walltime of this block; default: executor.walltime.")
    select_options: str | None = Field(
        None, description="PBS select options of this block; default: executor.select_options."
    )


def _polaris_gpu() -> GpuWorkers:
    return GpuWorkers(accelerators=4, cores_per_worker=8, cpu_affinity="block-reverse")


def _aurora_gpu() -> GpuWorkers:
    return GpuWorkers(
        accelerators=list(AURORA_TILES),
        cores_per_worker=16,
        cpu_affinity=AURORA_TILE_AFFINITY,
        launcher_overrides="--ppn 1",
    )


# --- executor configurations -------------------------------------------------------------------------------


class _HpcExecutorBase(HpcStrict):
    """Fields shared by every batch-scheduled platform."""

    walltime: Walltime = Field(description="Walltime of each batch job, HH:MM:SS.")
    worker_init: list[str] = Field(
        default_factory=list,
        description="Shell lines run on every node before Parsl's workers start (modules, venv).",
    )
    interface: str | None = Field(
        None,
        description="Network interface of the login node the workers connect back to "
        "(address_by_interface); None: Parsl tries every address.",
    )
    gpu: GpuWorkers = Field(default_factory=_polaris_gpu, description="The GPU worker block.")
    cpu: CpuWorkers | None = Field(
        None, description="The CPU worker block (label 'cpu'); omit to run CPU work on the GPU block."
    )
    driver_threads: int = Field(4, ge=1, description="Threads of the in-process 'driver' executor.")
    retries: int = Field(
        2, ge=0, description="Retries of a task lost with its worker or node (never of a bad input)."
    )
    checkpoint_mode: CheckpointMode | None = Field(
        "task_exit", description="Parsl checkpointing of memoized apps (BasicMemoizer); None: off."
    )
    heartbeat_period: int = Field(30, ge=1, description="Seconds between worker heartbeats.")
    heartbeat_threshold: int = Field(
        120, ge=1, description="Seconds without heartbeat after which a worker is lost."
    )
    drain_margin_s: int | None = Field(
        600,
        ge=0,
        description="Workers stop taking tasks this long before the walltime ends (None: never drain).",
    )
    node: NodeShape = Field(default_factory=NodeShape, description="Cores, sockets and GPUs of a node.")
    queues: dict[str, QueueLimits] = Field(
        default_factory=dict,
        description="Queue name -> limits; a job whose node count or walltime a queue rejects fails at "
        "plan time instead of in the scheduler.",
    )
    storage_media: list[StorageMedium] = Field(
        default_factory=lambda: ["memory", "ssd", "lustre"],
        description="Storage media the platform offers to database workers.",
    )


class _PbsExecutorBase(_HpcExecutorBase):
    """PBS Pro platforms (ALCF)."""

    account: str = Field(min_length=1, description="Project charged for the jobs (qsub -A).")
    queue: str = Field(min_length=1, description="Queue (qsub -q), e.g. debug, debug-scaling, prod.")
    filesystems: list[str] = Field(
        default_factory=lambda: ["home"],
        description="File systems the jobs need (#PBS -l filesystems=a:b).",
    )
    place: str | None = Field("scatter", description="#PBS -l place=...; None: omit.")
    select_options: str = Field("", description="Appended to #PBS -l select (e.g. ngpus=4).")
    scheduler_options: list[str] = Field(
        default_factory=list, description="Further #PBS directive lines, verbatim."
    )
    cpus_per_node: int = Field(64, ge=1, description="ncpus of the PBS select statement.")


class PolarisExecutorConfig(_PbsExecutorBase):
    """ALCF Polaris: PBS Pro, 4 x A100 and 32 cores per node, Lustre (Eagle), node-local SSD."""

    platform: Literal["polaris"] = Field("polaris", description="Selects this platform (ALCF Polaris).")
    filesystems: list[str] = Field(
        default_factory=lambda: ["home", "eagle"],
        description="File systems the jobs need (#PBS -l filesystems=a:b).",
    )
    select_options: str = Field("ngpus=4", description="Appended to #PBS -l select.")
    cpus_per_node: int = Field(64, ge=1, description="ncpus of the PBS select statement (hw threads).")
    interface: str | None = Field(
        "bond0", description="Login-node interface the workers reach (ALCF documents bond0)."
    )
    gpu: GpuWorkers = Field(default_factory=_polaris_gpu, description="The GPU worker block.")
    node: NodeShape = Field(
        default_factory=lambda: NodeShape(sockets=1, cores_per_socket=32, gpus=4),
        description="Cores, sockets and GPUs of a node.",
    )


class AuroraExecutorConfig(_PbsExecutorBase):
    """ALCF Aurora: PBS Pro, 6 Intel GPUs x 2 tiles and 104 cores per node, Lustre (Flare) and DAOS."""

    platform: Literal["aurora"] = Field("aurora", description="Selects this platform (ALCF Aurora).")
    filesystems: list[str] = Field(
        default_factory=lambda: ["home", "flare"],
        description="File systems the jobs need (#PBS -l filesystems=a:b).",
    )
    cpus_per_node: int = Field(208, ge=1, description="ncpus of the PBS select statement (hw threads).")
    gpu: GpuWorkers = Field(default_factory=_aurora_gpu, description="The GPU (tile) worker block.")
    node: NodeShape = Field(
        default_factory=lambda: NodeShape(sockets=2, cores_per_socket=52, gpus=6, reserved_cores=[0, 52]),
        description="Cores, sockets and GPUs of a node.",
    )
    storage_media: list[StorageMedium] = Field(
        default_factory=lambda: ["memory", "lustre", "daos"],
        description="Storage media the platform offers (Aurora nodes have no local SSD).",
    )


class SlurmExecutorConfig(_HpcExecutorBase):
    """A Slurm site: partition, account, constraint and GPUs per node from the YAML file."""

    platform: Literal["slurm"] = Field("slurm", description="Selects this platform (a Slurm site).")
    account: str | None = Field(None, description="Account charged (#SBATCH --account); None: default.")
    partition: str = Field(min_length=1, description="Partition (#SBATCH --partition).")
    qos: str | None = Field(None, description="Quality of service (#SBATCH --qos).")
    constraint: str | None = Field(None, description="Node features (#SBATCH --constraint), e.g. gpu.")
    gpus_per_node: int | None = Field(None, ge=1, description="#SBATCH --gpus-per-node.")
    cores_per_node: int | None = Field(None, ge=1, description="Cores requested per node.")
    mem_per_node: int | None = Field(None, ge=1, description="Memory per node in GB.")
    exclusive: bool = Field(True, description="Whole nodes (#SBATCH --exclusive).")
    scheduler_options: list[str] = Field(
        default_factory=list, description="Further #SBATCH directive lines, verbatim."
    )
    gpu: GpuWorkers = Field(
        default_factory=lambda: GpuWorkers(accelerators=4, cpu_affinity="block", launcher_overrides=""),
        description="The GPU worker block (SrunLauncher).",
    )


HPC_PLATFORMS = ("polaris", "aurora", "slurm")


# --- the database cluster (pilot block) --------------------------------------------------------------------


class DaosConfig(HpcStrict):
    """A DAOS POSIX container mounted with dfuse on every database node (Aurora)."""

    pool: str = Field(min_length=1, description="DAOS pool allocated to the project.")
    container: str = Field(min_length=1, description="POSIX container in the pool.")
    mount: str | None = Field(None, description="dfuse mount point; default /tmp/<pool>/<container>.")
    filesystem: str = Field("daos_user_fs", description="PBS filesystems entry that starts the DAOS agent.")
    setup: list[str] = Field(
        default_factory=lambda: ["module use /soft/modulefiles", "module load daos"],
        description="Shell lines before mounting (modules).",
    )
    mount_command: str = Field(
        "launch-dfuse.sh {pool}:{container}",
        description="Command that mounts the container on every node of the job.",
    )

    @property
    def mount_point(self) -> str:
        """Where the container is mounted on the nodes."""
        return self.mount or f"/tmp/{self.pool}/{self.container}"


class StorageConfig(HpcStrict):
    """Where database workers keep their data (the study's storage-medium axis)."""

    medium: StorageMedium = Field("memory", description="memory (/dev/shm), ssd, lustre or daos.")
    memory_path: str = Field("/dev/shm", description="tmpfs directory used for 'memory'.")
    ssd_path: str | None = Field(None, description="Node-local SSD directory used for 'ssd'.")
    lustre_path: str | None = Field(
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


class ImagesConfig(HpcStrict):
    """Apptainer images (.sif built from the vendors' Docker images), one per database."""

    qdrant: str | None = Field(None, description="qdrant/qdrant:v1.16.x image.")
    qdrant_gpu: str | None = Field(
        None, description="qdrant/qdrant:v1.16.x-gpu-nvidia image, used when gpu_indexing is on."
    )
    weaviate: str | None = Field(None, description="semitechnologies/weaviate:1.36.0 image.")
    milvus: str | None = Field(None, description="milvusdb/milvus:v2.6.x image.")
    etcd: str | None = Field(None, description="quay.io/coreos/etcd:v3.5.x image (Milvus distributed).")


class MilvusClusterConfig(HpcStrict):
    """Milvus layout: one standalone process, or the distributed roles on a shared file system."""

    mode: Literal["standalone", "distributed"] = Field(
        "standalone", description="standalone: one process with embedded etcd; distributed: roles below."
    )
    proxies: int = Field(1, ge=1, description="Proxy processes (clients connect to the first).")
    streaming_nodes: int = Field(1, ge=1, description="Streaming nodes (ingest, WAL).")
    query_nodes: int = Field(1, ge=1, description="Query nodes (search over sealed segments).")
    data_nodes: int = Field(1, ge=1, description="Data nodes (flush, compaction, index builds).")

    @property
    def ranks(self) -> int:
        """Processes the layout runs (standalone: 1; distributed: etcd + mixcoord + the roles)."""
        if self.mode == "standalone":
            return 1
        return 2 + self.proxies + self.streaming_nodes + self.query_nodes + self.data_nodes


class ClusterOverride(HpcStrict):
    """Settings of the database block that differ for one database (unset fields keep the block's)."""

    nodes: int | None = Field(None, ge=1, description="Nodes of this database's job.")
    workers: int | None = Field(None, ge=1, description="Ranks of this database.")
    workers_per_node: int | None = Field(None, ge=1, le=4, description="Ranks per node (at most 4).")
    cores_per_worker: int | None = Field(None, ge=1, description="Physical cores bound to each rank.")
    gpu_indexing: bool | None = Field(None, description="Qdrant: GPU HNSW build.")
    shards_per_worker: int | None = Field(None, ge=1, description="Collection shards per worker.")
    storage: StorageConfig | None = Field(None, description="Where this database's ranks keep data.")
    milvus: MilvusClusterConfig | None = Field(None, description="Milvus layout (milvus only).")


class DatabaseClusterConfig(HpcStrict):
    """The database pilot block: its own batch job and nodes; clients run on other nodes."""

    nodes: int = Field(1, ge=1, description="Nodes of the database job.")
    workers: int = Field(
        1,
        ge=1,
        description="Database server processes (ranks). Milvus distributed: etcd + mixcoord + roles.",
    )
    workers_per_node: int = Field(1, ge=1, le=4, description="Ranks per node (at most 4, as in the study).")
    cores_per_worker: int = Field(8, ge=1, description="Physical cores bound to each rank (one socket).")
    gpu_indexing: bool = Field(False, description="Qdrant: GPU HNSW build (GPU image, apptainer --nv).")
    shards_per_worker: int = Field(
        1, ge=1, description="Collection shards per worker: vdb.collection.shards must equal workers x this."
    )
    storage: StorageConfig = Field(default_factory=StorageConfig, description="Where ranks keep data.")
    images: ImagesConfig = Field(default_factory=ImagesConfig, description="Apptainer image per database.")
    milvus: MilvusClusterConfig = Field(
        default_factory=MilvusClusterConfig, description="Milvus standalone or distributed roles."
    )
    interface: str | None = Field(
        None, description="Interface whose IPv4 address ranks advertise (hsn0); None: hostname -i."
    )
    launcher: Literal["mpiexec", "srun", "local"] = Field(
        "mpiexec", description="How ranks start on the job's nodes; local: one node, no MPI (tests)."
    )
    apptainer: str = Field("apptainer", description="Apptainer executable on the compute nodes.")
    apptainer_args: list[str] = Field(
        default_factory=list, description="Extra apptainer exec arguments (e.g. --bind /lus)."
    )
    base_port: int = Field(
        20000, ge=1024, le=65000, description="First port; rank r uses base_port + r x port_stride onward."
    )
    port_stride: int = Field(10, ge=6, le=100, description="Ports reserved per rank.")
    queue: str | None = Field(None, description="Queue of the database job; default: executor.queue.")
    walltime: Walltime | None = Field(None, description="Walltime of the database job; default: executor's.")
    select_options: str | None = Field(
        None, description="PBS select options; default: executor.select_options."
    )
    scheduler_options: list[str] = Field(
        default_factory=list, description="Extra directive lines for the database job."
    )
    worker_init: list[str] = Field(
        default_factory=lambda: ["module load apptainer"],
        description="Shell lines run on the database job before the ranks start.",
    )
    startup_timeout_s: float = Field(
        900, gt=0, description="Seconds a rank waits for its server (and for rank 0) to be healthy."
    )
    overrides: dict[Literal["qdrant", "milvus", "weaviate"], ClusterOverride] = Field(
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


# --- cross-field checks ------------------------------------------------------------------------------------

Problem = tuple[tuple, str]


def _blocks(executor: Any, vdb: Any) -> Iterable[tuple[tuple, str, int, str, tuple]]:
    """(nodes path, queue, nodes, walltime, walltime path) of every batch job the run submits."""
    queue = getattr(executor, "queue", None) or getattr(executor, "partition", "")
    for label in ("gpu", "cpu"):
        block = getattr(executor, label)
        if block is not None:
            yield (
                ("executor", label, "nodes_per_block"),
                block.queue or queue,
                block.nodes_per_block,
                block.walltime or executor.walltime,
                ("executor", label, "walltime") if block.walltime else ("executor", "walltime"),
            )
    cluster = getattr(vdb, "cluster", None) if vdb else None
    if cluster is not None:
        for name in dict.fromkeys(db.name for db in vdb.databases):
            c = cluster.for_database(name)
            yield (
                cluster.field_path(name, "nodes"),
                c.queue or queue,
                c.nodes,
                c.walltime or executor.walltime,
                ("vdb", "cluster", "walltime") if c.walltime else ("executor", "walltime"),
            )


def _queue_problems(executor: Any, vdb: Any) -> list[Problem]:
    problems: list[Problem] = []
    table: dict[str, QueueLimits] = executor.queues
    if not table:
        return problems
    for loc, queue, nodes, walltime, wloc in _blocks(executor, vdb):
        limits = table.get(queue)
        if limits is None:
            own = getattr(executor, "queue", None)
            where = ("executor", "queue") if queue == own else (*loc[:-1], "queue")
            known = ", ".join(sorted(table))
            problems.append((where, f"queue {queue!r} is not in executor.queues ({known})"))
            continue
        if not limits.min_nodes <= nodes <= limits.max_nodes:
            problems.append(
                (
                    loc,
                    f"queue {queue!r} accepts {limits.min_nodes}-{limits.max_nodes} nodes per job, "
                    f"not {nodes}",
                )
            )
        if limits.max_walltime and walltime_seconds(walltime) > walltime_seconds(limits.max_walltime):
            problems.append((wloc, f"queue {queue!r} allows at most {limits.max_walltime}, not {walltime}"))
    return list(dict.fromkeys(problems))  # a shared block is reported once


def bind_lists(node: NodeShape, workers_per_node: int, cores_per_worker: int) -> list[list[int]] | None:
    """Physical cores of each node-local rank, every rank inside one socket; None when they do not fit.

    Ranks fill socket 0 first, then socket 1, skipping reserved cores, so a database never spans sockets.
    """
    free = [
        [
            c
            for c in range(s * node.cores_per_socket, (s + 1) * node.cores_per_socket)
            if c not in node.reserved_cores
        ]
        for s in range(node.sockets)
    ]
    lists: list[list[int]] = []
    socket = 0
    while len(lists) < workers_per_node:
        if socket >= node.sockets:
            return None
        if len(free[socket]) >= cores_per_worker:
            lists.append(free[socket][:cores_per_worker])
            free[socket] = free[socket][cores_per_worker:]
        else:
            socket += 1
    return lists


def _resolve(path: str, base_dir: Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or base_dir is None else base_dir / p


def image_for(cluster: DatabaseClusterConfig, database: str) -> tuple[str, str | None]:
    """(images field name, path) of the image a database runs from."""
    if database == "qdrant" and cluster.gpu_indexing:
        return "qdrant_gpu", cluster.images.qdrant_gpu
    return database, getattr(cluster.images, database)


def _database_problems(run_config: Any, name: str, base_dir: Path | None) -> list[Problem]:
    """Problems of one database's cluster (the block with that database's overrides applied)."""
    executor, vdb = run_config.executor, run_config.vdb
    block: DatabaseClusterConfig = vdb.cluster
    c = block.for_database(name)

    def at(*fields: str) -> tuple:
        return block.field_path(name, fields[0]) + tuple(fields[1:])

    problems: list[Problem] = []
    ranks, per_node = c.workers, c.workers_per_node
    if c.nodes * per_node < ranks:
        problems.append(
            (at("workers"), f"{name}: {ranks} workers do not fit on {c.nodes} node(s) x {per_node}")
        )
    elif math.ceil(ranks / per_node) < c.nodes:
        problems.append((at("nodes"), f"{name}: {c.nodes} nodes for {ranks} workers leaves nodes idle"))
    if c.base_port + ranks * c.port_stride > 65535:
        problems.append((at("base_port"), f"{name}: ports of {ranks} ranks exceed 65535"))
    if name == "milvus":
        m = c.milvus
        if m.mode == "distributed" and ranks != m.ranks:
            problems.append(
                (
                    at("workers"),
                    f"milvus distributed runs {m.ranks} processes (etcd, mixcoord, {m.proxies} proxy, "
                    f"{m.streaming_nodes} streaming, {m.query_nodes} query, {m.data_nodes} data): "
                    f"set workers: {m.ranks}",
                )
            )
        if m.mode == "standalone" and ranks != 1:
            problems.append((at("workers"), "milvus standalone is one process: set workers: 1"))

    node = getattr(executor, "node", None)
    if node is not None and bind_lists(node, per_node, c.cores_per_worker) is None:
        problems.append(
            (
                at("cores_per_worker"),
                f"{name}: {per_node} ranks x {c.cores_per_worker} cores do not fit one socket each "
                f"({node.sockets} x {node.cores_per_socket} cores, reserved {node.reserved_cores})",
            )
        )

    field, path = image_for(c, name)
    if not path:
        problems.append((("vdb", "cluster", "images", field), f"no Apptainer image for {name}"))
    elif not _resolve(path, base_dir).is_file():
        problems.append((("vdb", "cluster", "images", field), f"image {path} does not exist"))
    if name == "milvus" and c.milvus.mode == "distributed":
        if not c.images.etcd:
            problems.append((("vdb", "cluster", "images", "etcd"), "milvus distributed needs an etcd image"))
        elif not _resolve(c.images.etcd, base_dir).is_file():
            problems.append((("vdb", "cluster", "images", "etcd"), f"image {c.images.etcd} does not exist"))

    storage = c.storage
    offered = getattr(executor, "storage_media", ["memory", "ssd", "lustre", "daos"])
    if storage.medium not in offered:
        problems.append(
            (
                at("storage", "medium"),
                f"{executor.platform} offers {', '.join(offered)}; not {storage.medium}",
            )
        )
    elif storage.medium == "ssd" and not storage.ssd_path:
        problems.append((at("storage", "ssd_path"), "medium ssd needs ssd_path (node-local directory)"))
    elif storage.medium == "lustre":
        if not storage.lustre_path:
            problems.append((at("storage", "lustre_path"), "medium lustre needs lustre_path"))
        elif not _resolve(storage.lustre_path, base_dir).is_dir():
            problems.append((at("storage", "lustre_path"), f"directory {storage.lustre_path} does not exist"))
    elif storage.medium == "daos":
        if storage.daos is None:
            problems.append((at("storage", "daos"), "medium daos needs a daos section (pool, container)"))
        if name in ("qdrant", "weaviate"):  # the study: both mmap files, which dfuse does not support
            problems.append((at("storage", "medium"), f"{name} cannot run on DAOS (dfuse lacks mmap)"))
    if name == "milvus" and c.milvus.mode == "distributed" and c.nodes > 1 and not storage.shared:
        problems.append(
            (at("storage", "medium"), "milvus distributed over several nodes needs lustre or daos (shared)")
        )

    if c.gpu_indexing:
        if name != "qdrant":  # the block-wide flag only concerns Qdrant; an override asks explicitly
            if at("gpu_indexing")[2] == "overrides":
                problems.append((at("gpu_indexing"), f"only Qdrant indexes on GPUs here, not {name}"))
        elif executor.platform == "aurora":
            problems.append((at("gpu_indexing"), "Qdrant's GPU build supports NVIDIA/AMD, not Intel GPUs"))

    shards = c.workers * c.shards_per_worker
    if name in ("qdrant", "weaviate") and vdb.collection.shards != shards:
        problems.append(
            (
                ("vdb", "collection", "shards"),
                f"{name}: {c.workers} workers x {c.shards_per_worker} shard(s) each: set shards: {shards}",
            )
        )
    return problems


def _cluster_problems(run_config: Any, base_dir: Path | None) -> list[Problem]:
    vdb, executor = run_config.vdb, run_config.executor
    cluster: DatabaseClusterConfig = vdb.cluster
    problems: list[Problem] = []
    wanted = {"polaris": "mpiexec", "aurora": "mpiexec", "slurm": "srun", "local": "local"}[executor.platform]
    if cluster.launcher != wanted and not (cluster.launcher == "local" and cluster.nodes == 1):
        problems.append(
            (("vdb", "cluster", "launcher"), f"platform {executor.platform} starts ranks with {wanted!r}")
        )
    for i, db in enumerate(vdb.databases):  # the cluster starts the servers: no external ones
        if db.name == "qdrant" and (db.mode != "server" or db.url):
            problems.append(
                (("vdb", "databases", i, "mode"), "with vdb.cluster, qdrant needs mode: server, no url")
            )
        if db.name == "weaviate" and db.url:
            problems.append((("vdb", "databases", i, "url"), "with vdb.cluster, weaviate must not set url"))
        if db.name == "milvus" and db.uri:
            problems.append((("vdb", "databases", i, "uri"), "with vdb.cluster, milvus must not set uri"))
    for name in cluster.overrides:
        if name not in {db.name for db in vdb.databases}:
            problems.append((("vdb", "cluster", "overrides", name), f"{name} is not in vdb.databases"))
    for name in dict.fromkeys(db.name for db in vdb.databases):
        problems += _database_problems(run_config, name, base_dir)
    return list(dict.fromkeys(problems))


def check_platform(run_config: Any, base_dir: Path | None = None) -> list[Problem]:
    """Problems that need several sections at once, as (field path, message); empty when all is well.

    ``base_dir`` resolves relative image and storage paths (the config file's directory).
    """
    executor = run_config.executor
    vdb = getattr(run_config, "vdb", None)
    cluster = getattr(vdb, "cluster", None) if vdb else None
    problems: list[Problem] = []
    if executor.platform in HPC_PLATFORMS:
        account = getattr(executor, "account", None)
        if executor.platform != "slurm" and not (account or "").strip():
            problems.append((("executor", "account"), "an account (project) is required"))
        problems += _queue_problems(executor, vdb)
        gpu = executor.gpu
        if len(gpu.accelerator_ids) > executor.node.gpus * 2:  # tiles count twice at most
            problems.append((("executor", "gpu", "accelerators"), f"a node has {executor.node.gpus} GPUs"))
    if cluster is not None:
        problems += _cluster_problems(run_config, base_dir)
    return problems
