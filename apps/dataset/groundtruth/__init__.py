"""Exact ground truth: the stage, the float64 decision (exact_distance, exact_search), the candidate
kernels, prefix truth.
"""
