"""Database processes sampled once a second: the rank-side sampler and the driver-side collector (one-way
import).
"""
