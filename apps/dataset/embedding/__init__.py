"""The embedding stage: the Parsl app (stage), the Embedder (model), its runtimes (backends) and model
loading.
"""
