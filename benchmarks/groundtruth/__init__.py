"""Ground-truth stage versus FAISS's exact flat index: ``python -m benchmarks.groundtruth``."""
