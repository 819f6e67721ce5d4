"""The project's performance benchmarks, one package each: ``python -m benchmarks.<name>`` runs one,
``python -m benchmarks`` runs them all (``benchmarks/README.md``). Shared helpers are in ``common/``.

Nothing here is imported by ``core``, ``executors``, ``apps`` or ``pipeline``; this file imports nothing, so
``python -m benchmarks.groundtruth_gpu`` needs no more than that benchmark does.
"""
