"""Corpus to embedding dataset: shards, chunks, embeddings, the dataset layout, queries, exact ground
truth, geometry.
"""
