"""Parsl configurations: the local one, and one row per batch platform (``polaris``, ``aurora``, ``slurm``).

:mod:`executors.config` holds the platform models (pydantic only), :mod:`executors.labels` the executor
labels, :mod:`executors.platforms` the platform table (each row: its scheduler's provider and launcher) and
the one dispatcher to a ``parsl.Config``,
:mod:`executors.providers` one provider function per scheduler (used by the platforms' worker blocks and
the database pilot's job), :mod:`executors.hpc` the ``Config`` the batch platforms share, and
:mod:`executors.lifecycle` Parsl's start and its bounded end under signals.
"""
