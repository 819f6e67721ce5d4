"""FAISS: the library baseline a user would pick instead of a database, run inside the clients.

Everything about it lives in this folder: ``settings`` (its config model, pydantic only), ``rows`` (the
durable row store the insert stage writes), ``build`` (index construction, atomic index files, loading),
``client`` (the Client: insert, build_index, search, ...), ``deploy`` (a deployment that only owns the
data dir), ``adapter`` (assembles ``ADAPTER``) and ``checks`` (its config checks on HPC). There is no
server and no pilot job: like Qdrant edge it runs in the client block's processes (``IN_PROCESS_ONLY``).
"""
