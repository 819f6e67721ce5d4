"""Parsl configurations, one small function per platform (``local``, ``polaris``, ``aurora``, ``slurm``).

:mod:`executors.config` holds the platform models (pydantic only), :mod:`executors.labels` the executor
labels, :mod:`executors.platforms` the dispatcher that picks a platform's function,
:mod:`executors.providers` one provider function per scheduler (used by the platforms' worker blocks and
the database pilot's job) and :mod:`executors.hpc` the ``Config`` the batch platforms share.
"""
