"""Platform models: the local machine, ALCF Polaris and Aurora (PBS Pro), and Slurm sites.

Everything site- or user-specific (account, queue, file systems) comes from the YAML file; the defaults
below are only facts about the machines (cores, GPUs, the interface ALCF documents). Pydantic only:
validating a config imports no Parsl and no client library.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, Field, model_validator

from core.config import FieldError, Strict
from executors.affinity import (
    STRATEGIES,
    node_threads,
    parse_list,
    pool_size,
    reserved_threads,
    skip_reserved,
)
from executors.safe import (
    Accelerators,
    Account,
    Address,
    Interface,
    LauncherArgs,
    LauncherOption,
    PbsDirective,
    PbsFilesystem,
    PbsPlace,
    PbsSelect,
    SchedulerName,
    SlurmConstraint,
    SlurmDirective,
)

# --- small types -------------------------------------------------------------------------------------------

_WALLTIME = re.compile(r"(\d{1,3}):([0-5]\d):([0-5]\d)")
_AFFINITY = re.compile(r"none|block|block-reverse|alternating|list:[0-9,\-:]+")


def _check_walltime(value: str) -> str:
    # fullmatch, not match + '$': '$' also matches before a trailing newline, which would end a #PBS line
    if not _WALLTIME.fullmatch(value):
        raise ValueError("walltime must be HH:MM:SS, e.g. 01:00:00")  # pydantic adds the value
    return value


def _check_affinity(value: str) -> str:
    if not _AFFINITY.fullmatch(value):
        raise ValueError(
            "cpu_affinity must be none, block, block-reverse, alternating or list:<cores>:<cores>... "
            f"(got {value!r})"
        )
    return value


Walltime = Annotated[str, AfterValidator(_check_walltime)]
CpuAffinity = Annotated[str, AfterValidator(_check_affinity)]
QueuesAsOf = Annotated[str, Field(pattern=r"^\d{4}-(0[1-9]|1[0-2])$")]
StorageMedium = Literal["memory", "ssd", "lustre", "daos"]
CheckpointMode = Literal["task_exit", "periodic", "dfk_exit", "manual"]

# Parsl launches one worker per entry; Aurora exposes 6 GPUs x 2 tiles as '<gpu>.<tile>'.
AURORA_TILES = [f"{gpu}.{tile}" for gpu in range(6) for tile in range(2)]
# ALCF's documented affinity for 12 tile workers: 8 cores (+ hyper-threads) each, skipping reserved 0 and 52.
# Source: argonne-lcf/user-guides docs/aurora/workflows/parsl.md (cpu_affinity of the single-tile config).
AURORA_TILE_AFFINITY = (
    "list:1-8,105-112:9-16,113-120:17-24,121-128:25-32,129-136:33-40,137-144:41-48,145-152"
    ":53-60,157-164:61-68,165-172:69-76,173-180:77-84,181-188:85-92,189-196:93-100,197-204"
)
# The cores nearest each Polaris GPU, GPU 0 first: GPU 0 <-> cores 24-31 (+ hyper-threads 56-63), GPU 3 <->
# cores 0-7. Source: argonne-lcf/user-guides docs/polaris/workflows/parsl.md ("This give optimal binding of
# threads to GPUs on a Polaris node"), the reverse order of docs/polaris/running-jobs/using-gpus.md
# (set_affinity_gpu_polaris.sh: "need to assign GPUs in reverse order due to topology").
POLARIS_GPU_AFFINITY = "list:24-31,56-63:16-23,48-55:8-15,40-47:0-7,32-39"


def walltime_seconds(value: str) -> int:
    """Seconds in an HH:MM:SS walltime."""
    match = _WALLTIME.fullmatch(value)
    if not match:
        raise ValueError(f"not an HH:MM:SS walltime: {value!r}")
    hours, minutes, seconds = (int(g) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


MIN_DRAIN_PERIOD_S = 60  # workers take tasks for at least this long, whatever the margin


def drain_period(walltime: str, margin_s: int | None) -> int | None:
    """Seconds after which workers stop taking tasks, so none is killed mid-task by the walltime (None:
    never drain)."""
    if margin_s is None:
        return None
    return max(MIN_DRAIN_PERIOD_S, walltime_seconds(walltime) - margin_s)


# --- machine facts -----------------------------------------------------------------------------------------


class NodeShape(Strict):
    """What one compute node has; used to pin workers to cores of one socket."""

    sockets: int = Field(1, ge=1, description="CPU sockets per node.")
    cores_per_socket: int = Field(32, ge=1, description="Physical cores per socket.")
    threads_per_core: int = Field(2, ge=1, description="Hardware threads per physical core.")
    gpus: int = Field(4, ge=0, description="GPUs per node.")
    reserved_cores: list[int] = Field(
        default_factory=list,
        description="Physical cores the site reserves for the OS (Aurora: 0 and 52); never bound.",
    )
    gpu_cores: list[list[int]] = Field(
        default_factory=list,
        description="The physical cores nearest each GPU, GPU 0 first (Polaris: GPU 0 <-> 24-31); GPU "
        "workers and GPU-indexing database ranks are placed by it. Empty: GPU i is nearest the i-th share.",
    )
    memory_gib: float | None = Field(
        None, gt=0, description="Memory a job may use per node, GiB (the resource plan's capacity)."
    )
    shm_gib: float | None = Field(
        None, gt=0, description="Size of /dev/shm per node, GiB (storage medium memory); None: memory / 2."
    )
    ssd_gib: float | None = Field(
        None, ge=0, description="Node-local SSD per node, GiB (storage medium ssd); 0: none."
    )
    gpu_memory_gib: float | None = Field(None, gt=0, description="Memory of one GPU (or tile), GiB.")
    apptainer_fakeroot: bool = Field(
        False,
        description="Apptainer on the compute nodes needs --fakeroot (Polaris and Aurora: ALCF's "
        "container pages); vdb.cluster.fakeroot overrides it.",
    )

    @model_validator(mode="after")
    def _gpu_cores_on_the_node(self) -> Self:
        if self.gpu_cores and len(self.gpu_cores) != self.gpus:
            raise ValueError(f"gpu_cores lists {len(self.gpu_cores)} GPUs, the node has gpus: {self.gpus}")
        outside = sorted({c for cores in self.gpu_cores for c in cores if not 0 <= c < self.cores})
        if outside:
            raise ValueError(
                f"gpu_cores names cores {outside} outside the node's {self.cores} physical cores"
            )
        return self

    def nearest_gpu(self, cores: list[int], local_index: int) -> int:
        """The GPU whose cores overlap ``cores`` most (ties: the lower index); without ``gpu_cores``, or
        for a rank without cores, ``local_index`` modulo the GPUs."""
        if not self.gpu_cores or not cores:
            return local_index % self.gpus
        overlap = [len(set(cores) & set(near)) for near in self.gpu_cores]
        return overlap.index(max(overlap))

    @property
    def cores(self) -> int:
        """Physical cores per node."""
        return self.sockets * self.cores_per_socket


class _PerUserLimits(Strict):
    """Per-user limits of one execution queue (PBS max_run / max_queued / max_run_res.nodect)."""

    max_running_per_user: int | None = Field(
        None,
        ge=1,
        description="Most jobs of one user running at once (PBS max_run [u:PBS_GENERIC=n], Slurm QOS "
        "MaxJobsPU); None: no per-user limit known. Checked against the jobs a run needs at once.",
    )
    max_queued_per_user: int | None = Field(
        None,
        ge=1,
        description="Most jobs of one user queued or running in the queue (PBS max_queued, Slurm QOS "
        "MaxSubmitPU); qsub refuses more. None: no per-user limit known.",
    )
    max_running_nodes_per_user: int | None = Field(
        None,
        ge=1,
        description="Most nodes of one user's running jobs together (PBS max_run_res.nodect "
        "[u:PBS_GENERIC=n]); None: no such limit known.",
    )


class QueueRoute(_PerUserLimits):
    """An execution queue that a routing queue sends jobs of some sizes to (PBS routing queues)."""

    queue: str = Field(min_length=1, description="Name of the execution queue (e.g. Polaris's small).")
    min_nodes: int = Field(1, ge=1, description="Smallest job (nodes) routed here.")
    max_nodes: int = Field(ge=1, description="Largest job (nodes) routed here.")
    max_walltime: Walltime = Field(description="Longest walltime this execution queue grants (HH:MM:SS).")


class QueueLimits(_PerUserLimits):
    """What one queue accepts (the site's documentation, or read live: executors/queues.py); checked at
    plan time."""

    min_nodes: int = Field(1, ge=1, description="Smallest job (nodes) the queue accepts.")
    max_nodes: int | None = Field(
        None, ge=1, description="Largest job (nodes) the queue accepts; None: no node limit known."
    )
    min_walltime: Walltime | None = Field(
        None, description="Shortest walltime the queue accepts (HH:MM:SS; ALCF: 00:05:00)."
    )
    max_walltime: Walltime | None = Field(None, description="Longest walltime the queue accepts (HH:MM:SS).")
    routes: list[QueueRoute] = Field(
        default_factory=list,
        description="A routing queue (Polaris's and Aurora's prod): the execution queue each job size goes "
        "to, with its own walltime and per-user limits; a job no route takes, or asking more than its route "
        "grants, fails at plan time.",
    )

    def route(self, nodes: int) -> QueueRoute | None:
        """The execution queue a job of ``nodes`` nodes is routed to (None: no route takes it)."""
        return next((r for r in self.routes if r.min_nodes <= nodes <= r.max_nodes), None)

    def accepts_nodes(self, nodes: int) -> bool:
        """Whether a job of ``nodes`` nodes is within the queue's own node range."""
        return self.min_nodes <= nodes and (self.max_nodes is None or nodes <= self.max_nodes)


# --- Parsl blocks ------------------------------------------------------------------------------------------


class GpuWorkers(Strict):
    """GPU HighThroughputExecutor (label 'workers'): embedding, ground truth; one worker per GPU or tile."""

    nodes_per_block: int = Field(1, ge=1, description="Nodes per batch job (one Parsl block).")
    init_blocks: int = Field(1, ge=0, description="Blocks submitted when the run starts.")
    min_blocks: int = Field(0, ge=0, description="Blocks kept even when idle.")
    max_blocks: int = Field(1, ge=1, description="Most blocks (batch jobs) at once.")
    accelerators: Accelerators = Field(
        4,
        description="GPUs a node offers to workers: a count (ids 0..n-1) or explicit ids such as Aurora "
        "tiles '0.0'; Parsl starts one worker per entry and pins it (CUDA_VISIBLE_DEVICES, "
        "ZE_AFFINITY_MASK). 0: a node without GPUs, one worker per node (the local Slurm testbed).",
    )
    cores_per_worker: float = Field(8, gt=0, description="CPU hardware threads per worker.")
    cpu_affinity: CpuAffinity = Field(
        "block-reverse",
        description="Parsl worker CPU pinning: block, block-reverse, alternating, or an explicit "
        "list:<cores>:<cores>... per worker (Polaris: ALCF's list, GPU 0 <-> cores 24-31). On a node with "
        "reserved_cores a strategy becomes the explicit list that skips them and their hyper-threads.",
    )
    prefetch_capacity: int = Field(
        0, ge=0, description="Tasks prefetched beyond free workers (0: best balance for long tasks)."
    )
    bind_cmd: LauncherOption = Field(
        "--cpu-bind", description="MpiExecLauncher option that binds the manager."
    )
    launcher_overrides: LauncherArgs = Field(
        "--depth=64 --ppn 1",
        description="Extra mpiexec arguments: one manager per node (--ppn 1) owning all cores.",
    )
    queue: SchedulerName | None = Field(None, description="Queue for this block; default: executor.queue.")
    walltime: Walltime | None = Field(None, description="Walltime of this block; default: executor.walltime.")
    select_options: PbsSelect | None = Field(
        None, description="PBS select options of this block; default: executor.select_options."
    )

    @property
    def accelerator_ids(self) -> list[str]:
        """The accelerator ids as Parsl names them."""
        if isinstance(self.accelerators, int):
            return [str(i) for i in range(self.accelerators)]
        return list(self.accelerators)


class CpuWorkers(Strict):
    """CPU HighThroughputExecutor (label 'cpu'): sharding, chunking without a model, database clients."""

    nodes_per_block: int = Field(1, ge=1, description="Nodes per batch job.")
    init_blocks: int = Field(0, ge=0, description="Blocks submitted when the run starts (0: on demand).")
    min_blocks: int = Field(0, ge=0, description="Blocks kept even when idle.")
    max_blocks: int = Field(1, ge=1, description="Most blocks at once.")
    workers_per_node: int = Field(8, ge=1, description="Worker processes per node.")
    cores_per_worker: float = Field(4, gt=0, description="CPU hardware threads per worker.")
    cpu_affinity: CpuAffinity = Field("block", description="Parsl worker CPU pinning (see the GPU block).")
    bind_cmd: LauncherOption = Field("--cpu-bind", description="Launcher option that binds the manager.")
    launcher_overrides: LauncherArgs = Field("--depth=64 --ppn 1", description="Extra launcher arguments.")
    queue: SchedulerName | None = Field(None, description="Queue for this block; default: executor.queue.")
    walltime: Walltime | None = Field(None, description="Walltime of this block; default: executor.walltime.")
    select_options: PbsSelect | None = Field(
        None, description="PBS select options of this block; default: executor.select_options."
    )


def _polaris_gpu() -> GpuWorkers:
    return GpuWorkers(accelerators=4, cores_per_worker=8, cpu_affinity=POLARIS_GPU_AFFINITY)


def _polaris_node() -> NodeShape:
    # 1 x AMD EPYC Milan, 32 cores x 2 threads, 4 x A100: argonne-lcf/user-guides
    # docs/polaris/index.md. --fakeroot: docs/polaris/containers/containers.md
    # ("Always use the --fakeroot flag on Polaris compute nodes").
    return NodeShape(
        sockets=1,
        cores_per_socket=32,
        gpus=4,
        gpu_cores=[[c for c in share if c < 32] for share in parse_list(POLARIS_GPU_AFFINITY)],
        # docs/polaris/index.md: 512 GiB DDR4, 2 x 1.6 TB local SSD (RAID0, 3.2 TB), A100 40 GiB. /dev/shm:
        # the guide gives no size; Linux's tmpfs default is half of memory.
        memory_gib=512,
        shm_gib=256,
        ssd_gib=2980,  # 3.2e12 bytes
        gpu_memory_gib=40,
        apptainer_fakeroot=True,
    )


def _aurora_gpu() -> GpuWorkers:
    return GpuWorkers(
        accelerators=list(AURORA_TILES),
        cores_per_worker=16,
        cpu_affinity=AURORA_TILE_AFFINITY,
        launcher_overrides="--ppn 1",
    )


# --- executor configurations -------------------------------------------------------------------------------


class _HpcExecutorBase(Strict):
    """Fields shared by every batch-scheduled platform."""

    walltime: Walltime = Field(description="Walltime of each batch job, HH:MM:SS.")
    worker_init: list[str] = Field(
        default_factory=list,
        description="Shell lines run on every node before Parsl's workers start (modules, venv). Shell by "
        "design: each line is copied verbatim into the job script and is not checked or quoted, so write "
        "only commands you would type yourself.",
    )
    interface: Interface | None = Field(
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
        "task_exit",
        description="Parsl checkpointing of memoized apps (BasicMemoizer); None: off. No app is memoized "
        "today, so nothing is checkpointed: resume is by content-keyed stage directories.",
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
        description="Queue name -> limits; a job whose node count or walltime a queue rejects, or a run "
        "needing more jobs at once than a queue runs per user, fails at plan time instead of in the "
        "scheduler. validate/plan read the limits live (qstat -Qf, scontrol show partition) where the "
        "command answers, and use this table otherwise (--queue-limits).",
    )
    queues_as_of: QueuesAsOf | None = Field(
        None,
        description="When the queues table was last checked against the site's documentation, YYYY-MM "
        "(e.g. 2026-08); plan says the table of this date was used when the limits cannot be read live.",
    )
    storage_media: list[StorageMedium] = Field(
        default_factory=lambda: ["memory", "ssd", "lustre"],
        description="Storage media the platform offers to database workers.",
    )
    allocation: Literal["separate", "one"] = Field(
        "separate",
        description="separate: each Parsl block and each database is its own batch job (the driver on a "
        "login node); one: the whole run in one batch job whose script (plan: job-allocation.sh) runs the "
        "driver on its first node, the nodes split among the GPU block, the CPU block and the databases, "
        "for queues whose per-user limits cannot hold the separate jobs at once (executors/allocation.py).",
    )

    @model_validator(mode="after")
    def _one_block_each_in_one_allocation(self) -> Self:
        if self.allocation == "one":
            for name in ("gpu", "cpu"):
                block = getattr(self, name)
                if block is not None and block.max_blocks != 1:
                    raise ValueError(f"allocation one holds one {name} block: {name}.max_blocks must be 1")
        return self

    @model_validator(mode="after")
    def _a_worker_fits_a_node(self) -> Self:
        """A block whose worker needs more hardware threads than a node has starts no worker: its tasks
        would wait out the walltime with nothing said (Parsl: "Manager will spawn 0 workers")."""
        threads = node_threads(self.node)
        for name in ("gpu", "cpu"):
            block = getattr(self, name)
            if block is not None and pool_size(self.node, 1, block.cores_per_worker) < 1:
                raise FieldError(
                    (name, "cores_per_worker"),
                    f"{block.cores_per_worker:g} hardware threads per worker, but a node (executor.node) has "
                    f"{threads}: no worker would start; ask for at most {threads}",
                )
        return self

    @model_validator(mode="after")
    def _pin_off_reserved_cores(self) -> Self:
        """On a node with reserved cores no worker is bound to them (:mod:`executors.affinity`).

        A strategy (block, block-reverse, alternating) becomes the explicit list that skips them and their
        hyper-threads; an explicit list that binds one is an error naming the block.
        """
        if not self.node.reserved_cores:
            return self
        reserved = reserved_threads(self.node)
        for name in ("gpu", "cpu"):
            block = getattr(self, name)
            if block is None:
                continue
            most = len(block.accelerator_ids) if name == "gpu" else block.workers_per_node
            if block.cpu_affinity in STRATEGIES:
                workers = pool_size(self.node, most, block.cores_per_worker)
                pinned = skip_reserved(self.node, block.cpu_affinity, workers)
                setattr(self, name, block.model_copy(update={"cpu_affinity": pinned}))  # validated again
            elif block.cpu_affinity.startswith("list:"):
                bound = sorted(reserved & {t for share in parse_list(block.cpu_affinity) for t in share})
                if bound:
                    raise ValueError(
                        f"{name}.cpu_affinity binds the reserved cores' threads {bound} "
                        f"(node.reserved_cores {self.node.reserved_cores})"
                    )
        return self


class _PbsExecutorBase(_HpcExecutorBase):
    """PBS Pro platforms (ALCF)."""

    account: Account = Field(description="Project charged for the jobs (qsub -A).")
    queue: SchedulerName = Field(description="Queue (qsub -q), e.g. debug, debug-scaling, prod.")
    filesystems: list[PbsFilesystem] = Field(
        default_factory=lambda: ["home"],
        description="File systems the jobs need (#PBS -l filesystems=a:b).",
    )
    place: PbsPlace | None = Field("scatter", description="#PBS -l place=...; None: omit.")
    select_options: PbsSelect = Field("", description="Appended to #PBS -l select (e.g. ngpus=4).")
    scheduler_options: list[PbsDirective] = Field(
        default_factory=list, description="Further #PBS directive lines, verbatim (each starts with #PBS)."
    )
    cpus_per_node: int = Field(64, ge=1, description="ncpus of the PBS select statement.")
    preemptable_queues: list[SchedulerName] = Field(
        default_factory=lambda: ["preemptable"],
        description="Queues whose jobs may be killed for others; their jobs are submitted rerunnable "
        "(#PBS -r y) and database data directories do not name the job (a rerun finds data kept on "
        "lustre or daos; node-local /local/scratch and /dev/shm do not outlive a job). ALCF: "
        "argonne-lcf/user-guides docs/polaris/running-jobs/index.md (preemptable queue, #PBS -r y), "
        "docs/data-management/filesystem-and-storage/index.md (node SSD wiped between jobs).",
    )


class PolarisExecutorConfig(_PbsExecutorBase):
    """ALCF Polaris: PBS Pro, 4 x A100 and 32 cores per node, Lustre (Eagle), node-local SSD."""

    platform: Literal["polaris"] = Field("polaris", description="Selects this platform (ALCF Polaris).")
    filesystems: list[PbsFilesystem] = Field(
        default_factory=lambda: ["home", "eagle"],
        description="File systems the jobs need (#PBS -l filesystems=a:b).",
    )
    select_options: PbsSelect = Field("ngpus=4", description="Appended to #PBS -l select.")
    cpus_per_node: int = Field(64, ge=1, description="ncpus of the PBS select statement (hw threads).")
    interface: Interface | None = Field(
        # Parsl's parsl/configs/polaris.py (address_by_interface('bond0')); ALCF's own pages do not name it
        "bond0",
        description="Login-node interface the workers reach (bond0, as Parsl's Polaris config).",
    )
    gpu: GpuWorkers = Field(default_factory=_polaris_gpu, description="The GPU worker block.")
    node: NodeShape = Field(
        default_factory=_polaris_node,
        description="Cores, sockets and GPUs of a node.",
    )


class AuroraExecutorConfig(_PbsExecutorBase):
    """ALCF Aurora: PBS Pro, 6 Intel GPUs x 2 tiles and 104 cores per node, Lustre (Flare) and DAOS."""

    platform: Literal["aurora"] = Field("aurora", description="Selects this platform (ALCF Aurora).")
    filesystems: list[PbsFilesystem] = Field(
        default_factory=lambda: ["home", "flare"],
        description="File systems the jobs need (#PBS -l filesystems=a:b).",
    )
    cpus_per_node: int = Field(208, ge=1, description="ncpus of the PBS select statement (hw threads).")
    interface: Interface | None = Field(
        "hsn0",
        description="Login-node interface the workers reach: the Slingshot network, as ALCF's Aurora Parsl "
        "page binds it (argonne-lcf/user-guides docs/aurora/workflows/parsl.md, address_by_interface).",
    )
    gpu: GpuWorkers = Field(default_factory=_aurora_gpu, description="The GPU (tile) worker block.")
    node: NodeShape = Field(
        # --fakeroot: argonne-lcf/user-guides docs/aurora/containers/containers.md (every apptainer command)
        # Memory: docs/aurora/system-updates.md (June 2025): about 960 GB between DDR5 and HBM may be
        # allocated. No node-local SSD (docs/data-management/filesystem-and-storage/index.md: node SSDs on
        # Polaris only). GPU memory is one tile's, as each GPU worker is one tile: 768 GiB over 6 GPUs of 2
        # tiles (docs/aurora/index.md); a tile shows total_memory=65520MB (data-science/frameworks/
        # pytorch.md).
        default_factory=lambda: NodeShape(
            sockets=2,
            cores_per_socket=52,
            gpus=6,
            reserved_cores=[0, 52],
            memory_gib=894,  # 960e9 bytes
            shm_gib=447,  # Linux's tmpfs default, half of memory: the guide gives no size
            ssd_gib=0,
            gpu_memory_gib=64,
            apptainer_fakeroot=True,
        ),
        description="Cores, sockets and GPUs of a node.",
    )
    storage_media: list[StorageMedium] = Field(
        default_factory=lambda: ["memory", "lustre", "daos"],
        description="Storage media the platform offers (Aurora nodes have no local SSD).",
    )


class SlurmExecutorConfig(_HpcExecutorBase):
    """A Slurm site: partition, account, constraint and GPUs per node from the YAML file."""

    platform: Literal["slurm"] = Field("slurm", description="Selects this platform (a Slurm site).")
    account: Account | None = Field(None, description="Account charged (#SBATCH --account); None: default.")
    partition: SchedulerName = Field(description="Partition (#SBATCH --partition).")
    qos: SchedulerName | None = Field(None, description="Quality of service (#SBATCH --qos).")
    constraint: SlurmConstraint | None = Field(
        None, description="Node features (#SBATCH --constraint), e.g. gpu or 'a100&ib'."
    )
    gpus_per_node: int | None = Field(None, ge=1, description="#SBATCH --gpus-per-node.")
    cores_per_node: int | None = Field(None, ge=1, description="Cores requested per node.")
    mem_per_node: int | None = Field(None, ge=1, description="Memory per node in GB.")
    exclusive: bool = Field(True, description="Whole nodes (#SBATCH --exclusive).")
    scheduler_options: list[SlurmDirective] = Field(
        default_factory=list,
        description="Further #SBATCH directive lines, verbatim (each starts with #SBATCH).",
    )
    gpu: GpuWorkers = Field(
        default_factory=lambda: GpuWorkers(accelerators=4, cpu_affinity="block", launcher_overrides=""),
        description="The GPU worker block (SrunLauncher).",
    )


HPC_PLATFORMS = ("polaris", "aurora", "slurm")


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


class LocalExecutorConfig(Strict):
    """Parsl HighThroughputExecutor with LocalProvider on loopback (a laptop or CI machine)."""

    platform: Literal["local"] = Field("local", description="Selects this platform (one machine).")
    workers: int = Field(2, ge=1, description="Worker processes (each loads the model once).")
    address: Address = Field("127.0.0.1", description="Interface the interchange listens on.")


ExecutorConfig = Annotated[
    LocalExecutorConfig | PolarisExecutorConfig | AuroraExecutorConfig | SlurmExecutorConfig,
    Field(discriminator="platform"),
]
