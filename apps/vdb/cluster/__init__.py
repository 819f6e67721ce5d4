"""Database clusters on HPC nodes, shared by every database: one batch job of Apptainer ranks (a pilot).

``config`` the cluster block of the run config (pydantic only); ``layout`` which rank runs where (cores,
ports, data); ``render`` the rank scripts around the shell library ``lib.sh`` and ``launch.sh``;
``provider`` the Parsl provider of the job (built by :mod:`executors.providers`); ``pilot`` the deployment
that submits the job, waits for every rank and stops them. Each database's own ranks come from
``apps/vdb/<name>/ranks.py``.
"""
