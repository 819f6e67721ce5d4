"""The Parsl provider that submits a database cluster's batch job (its own nodes, queue and walltime)."""

from __future__ import annotations

from typing import Any

from apps.vdb.cluster.config import DatabaseClusterConfig
from executors.config import NodeShape


def cluster_provider(executor: Any, cluster: DatabaseClusterConfig) -> Any:
    """The Parsl provider that submits the database job (its own nodes, queue and walltime)."""
    from parsl.launchers import SimpleLauncher

    init = list(cluster.worker_init)
    daos = cluster.storage.daos if cluster.storage.medium == "daos" else None
    if daos is not None:
        init += [*daos.setup, daos.mount_command.format(pool=daos.pool, container=daos.container)]
    walltime = cluster.walltime or getattr(executor, "walltime", "01:00:00")
    if executor.platform in ("polaris", "aurora"):
        from parsl.providers import PBSProProvider

        from executors.hpc import pbs_scheduler_options

        filesystems = list(executor.filesystems) + ([daos.filesystem] if daos else [])
        select = cluster.select_options if cluster.select_options is not None else executor.select_options
        return PBSProProvider(
            account=executor.account,
            queue=cluster.queue or executor.queue,
            select_options=select,
            scheduler_options=pbs_scheduler_options(
                filesystems, executor.place, [*executor.scheduler_options, *cluster.scheduler_options]
            ),
            worker_init="\n".join(init),
            nodes_per_block=cluster.nodes,
            cpus_per_node=executor.cpus_per_node,
            init_blocks=0,
            min_blocks=0,
            max_blocks=1,
            walltime=walltime,
            launcher=SimpleLauncher(),  # the command runs mpiexec itself
        )
    if executor.platform == "slurm":
        from parsl.providers import SlurmProvider

        return SlurmProvider(
            partition=cluster.queue or executor.partition,
            account=executor.account,
            qos=executor.qos,
            constraint=executor.constraint,
            nodes_per_block=cluster.nodes,
            gpus_per_node=executor.gpus_per_node if cluster.gpu_indexing else None,
            init_blocks=0,
            min_blocks=0,
            max_blocks=1,
            walltime=walltime,
            scheduler_options="\n".join([*executor.scheduler_options, *cluster.scheduler_options]),
            worker_init="\n".join(init),
            exclusive=executor.exclusive,
            launcher=SimpleLauncher(),
        )
    from parsl.providers import LocalProvider

    return LocalProvider(
        init_blocks=0, min_blocks=0, max_blocks=1, worker_init="\n".join(init), launcher=SimpleLauncher()
    )


def node_shape(executor: Any) -> NodeShape:
    """The executor's node shape (the local platform: this machine, unbound)."""
    return getattr(executor, "node", None) or NodeShape(sockets=1, cores_per_socket=1, gpus=0)
