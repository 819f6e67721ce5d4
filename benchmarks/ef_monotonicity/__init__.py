"""Does the query stage's QPS fall as ef rises: ``python -m benchmarks.ef_monotonicity``."""
