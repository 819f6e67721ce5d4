"""Insert stage versus each vendor's bulk-upload path: ``python -m benchmarks.ingest``."""
