"""Labels of the Parsl executors every platform configures; stages name these to choose where they run."""

# The heavy stages (chunk, embed, ground truth) run in these worker processes (GPU nodes on HPC).
WORKERS = "workers"
# HPC only: CPU-bound work (chunking, database clients) on nodes of its own.
CPU = "cpu"
# The in-process thread executor for bookkeeping tasks (manifests, dataset card, database deployments).
DRIVER = "driver"
