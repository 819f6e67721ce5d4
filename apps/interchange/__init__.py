"""ANN datasets in and out: the community's formats (formats, vecs), import into this layout, export from
it.
"""
