"""The project's query stage versus VectorDBBench: ``python -m benchmarks.peer_vectordbbench``."""
