"""The ground truth's GPU path against FAISS's answer: ``python -m benchmarks.groundtruth_gpu``."""
