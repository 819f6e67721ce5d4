"""The Parsl provider that submits a database cluster's batch job (its own nodes, queue and walltime).

Built by the same per-scheduler functions as the platforms' worker blocks (:mod:`executors.providers`);
only the request differs: the cluster's nodes and overrides, its own shell set-up, and a plain launcher
because the job's command starts the ranks itself (``mpiexec``, ``srun`` or a local loop).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from parsl.launchers import SimpleLauncher

from apps.vdb.cluster.config import DatabaseClusterConfig
from executors.allocation import in_one_allocation, restrict_to
from executors.providers import JobRequest, local_provider, provider_for


def cluster_provider(
    executor: Any, cluster: DatabaseClusterConfig, hosts: list[str] | None = None, run_dir: Path | None = None
) -> Any:
    """The Parsl provider that submits the database job for ``executor.platform``'s scheduler; under
    ``executor.allocation: one``, a LocalProvider that starts it inside the run's own job, on ``hosts``
    (the database nodes of :mod:`executors.allocation`; its PBS node file goes under ``run_dir``)."""
    init = list(cluster.worker_init)
    daos = cluster.storage.daos if cluster.storage.medium == "daos" else None
    if daos is not None:
        init += [*daos.setup, daos.mount_command.format(pool=daos.pool, container=daos.container)]
    request = JobRequest(
        nodes=cluster.nodes,
        worker_init="\n".join(init),
        launcher=SimpleLauncher(),  # the command runs mpiexec / srun itself
        queue=cluster.queue,
        walltime=cluster.walltime,
        select_options=cluster.select_options,
        filesystems=(daos.filesystem,) if daos else (),
        scheduler_options=tuple(cluster.scheduler_options),
        gpus=cluster.gpu_indexing,
        # Never asked of the database job: its own srun sets tasks per node and CPU masks, while Parsl
        # turns these into --cpus-per-task and --mem for one task (a worker manager) per node.
        cores_and_memory=False,
    )
    if in_one_allocation(executor):
        if hosts is None or run_dir is None:
            raise ValueError("allocation one: the database job needs its nodes and a directory")
        line, _ = restrict_to(executor.platform, "databases", hosts, run_dir)
        return local_provider(
            replace(request, nodes=1, worker_init="\n".join([*init, line] if line else init))
        )
    return provider_for(executor, request)
