"""Peak memory of a pipeline run on 1x versus 10x the corpus: ``python -m benchmarks.memory``."""
