"""Query stage QPS versus a minimal direct client loop: ``python -m benchmarks.query_harness``."""
