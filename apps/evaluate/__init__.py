"""Metrics computed afterwards from raw files: recall, QPS and latency, the operating-point rules, the
results table.
"""
