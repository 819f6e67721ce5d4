"""Embed stage versus plain ``SentenceTransformer.encode``: ``python -m benchmarks.embed``."""
