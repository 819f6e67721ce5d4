"""Parsl configurations, one small function per platform (``local``, ``polaris``, ``aurora``, ``slurm``).

:mod:`executors.config` holds the platform models (pydantic only), :mod:`executors.labels` the executor
labels, :mod:`executors.platforms` the dispatcher that picks a platform's function.
"""
