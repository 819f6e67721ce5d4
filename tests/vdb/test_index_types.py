"""Index types, quantisation and on-disk storage: what each database builds is checked when the config is
validated, and a combination it cannot build fails naming vdb.collection.<field> and the database.

The recall tests of each variant run against the real engines in test_milvus.py, test_qdrant.py and
test_weaviate.py; docs/vector-databases.md has the table these checks follow.
"""

from __future__ import annotations

from typing import Any, get_args

import pytest
from pydantic import ValidationError

from apps.vdb import DATABASES
from apps.vdb.base import IndexType
from apps.vdb.capabilities import on_disk_index_types, quantizations
from apps.vdb.config import VdbConfig
from apps.vdb.qdrant.storage import pq_ratio


def vdb(database: str, cluster: dict | None = None, **collection: Any) -> VdbConfig:
    """A vdb block with one database and the given collection fields."""
    data: dict[str, Any] = {"databases": [{"name": database}], "collection": collection}
    if cluster is not None:
        data["cluster"] = cluster
    return VdbConfig.model_validate(data)


# What each database builds (index type, quantization, on_disk): these must validate.
ACCEPTED = [
    ("milvus", "ivf_flat", "scalar", False),
    ("milvus", "ivf_pq", "pq", False),
    ("milvus", "ivf_pq", "none", False),
    ("qdrant", "hnsw", "scalar", True),
    ("qdrant", "hnsw", "pq", False),
    ("qdrant", "hnsw", "bq", True),
    ("qdrant", "flat", "none", True),
    ("weaviate", "hnsw", "pq", False),
    ("weaviate", "hnsw", "scalar", False),
    ("weaviate", "flat", "bq", True),
    ("weaviate", "dynamic", "bq", False),
]


@pytest.mark.parametrize(("database", "index_type", "quantization", "on_disk"), ACCEPTED)
def test_supported_combinations_validate(database, index_type, quantization, on_disk) -> None:
    cfg = vdb(database, index_type=index_type, quantization=quantization, on_disk=on_disk)
    assert cfg.collection.quantization == quantization and cfg.collection.on_disk is on_disk


# (database, collection fields, what the error must say)
REFUSED = [
    (
        "milvus",
        {"quantization": "scalar"},
        r"quantization 'scalar' with index_type 'hnsw' is not built by "
        r"vdb\.databases\[0\] \(milvus\); with hnsw it builds: none: Milvus 2\.3 quantises only inside IVF",
    ),
    ("milvus", {"index_type": "ivf_flat", "quantization": "pq"}, r"with ivf_flat it builds: none, scalar"),
    (
        "milvus",
        {"on_disk": True},
        r"vdb\.collection\.on_disk true with index_type 'hnsw' is not supported by "
        r"vdb\.databases\[0\] \(milvus\); on disk it builds: diskann: .*mmap came in 2\.4",
    ),
    (
        "milvus",
        {"index_type": "diskann"},
        r"vdb\.collection\.index_type is not supported by vdb\.databases\[0\] "
        r"\(milvus\): 'diskann': the PyPI `milvus` 2\.3\.5 server .* built without DiskANN",
    ),
    ("qdrant", {"index_type": "flat", "quantization": "scalar"}, r"\(qdrant\); with flat it builds: none"),
    (
        "qdrant",
        {"quantization": "pq", "pq_bits": 4},
        r"vdb\.collection\.pq_bits .*\(qdrant\): 4: .*8-bit codes",
    ),
    (
        "qdrant",
        {"index_type": "ivf_pq"},
        r"collection\.index_type\n  .ivf_pq. is not built by .*\(qdrant\)",
    ),
    (
        "weaviate",
        {"index_type": "flat", "quantization": "pq"},
        r"\(weaviate\); with flat it builds: none, bq: "
        r"Weaviate's flat index .* BQ only",
    ),
    (
        "weaviate",
        {"on_disk": True},
        r"on_disk true with index_type 'hnsw' .*\(weaviate\); on disk it builds: flat",
    ),
    ("weaviate", {"quantization": "pq", "pq_bits": 10}, r"pq_bits .*\(weaviate\): 10: .*256 centroids"),
]


@pytest.mark.parametrize(("database", "fields", "message"), REFUSED)
def test_unsupported_combinations_fail_at_validation(database, fields, message) -> None:
    with pytest.raises(ValidationError, match=message):
        vdb(database, **fields)


def test_weaviate_dynamic_without_async_indexing_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"index_type .*\(weaviate\): 'dynamic' needs async_indexing"):
        VdbConfig.model_validate(
            {
                "databases": [{"name": "weaviate", "async_indexing": False}],
                "collection": {"index_type": "dynamic"},
            }
        )


def test_milvus_diskann_where_the_server_has_it() -> None:
    # An existing server (uri) or the milvusdb/milvus image on HPC (runtime apptainer) builds DISKANN.
    attached = VdbConfig.model_validate(
        {
            "databases": [{"name": "milvus", "uri": "http://127.0.0.1:19530"}],
            "collection": {"index_type": "diskann"},
        }
    )
    assert attached.collection.index_type == "diskann"
    with pytest.raises(ValidationError, match=r"config_overrides: \{queryNode\.enableDisk: true\}"):
        vdb("milvus", cluster={}, index_type="diskann")
    image = VdbConfig.model_validate(
        {
            "databases": [{"name": "milvus", "config_overrides": {"queryNode.enableDisk": True}}],
            "collection": {"index_type": "diskann", "on_disk": True},
            "cluster": {},
        }
    )
    assert image.collection.on_disk
    with pytest.raises(ValidationError, match="built without DiskANN"):
        vdb("milvus", cluster={"runtime": "native"}, index_type="diskann")


def test_the_second_database_is_named() -> None:
    with pytest.raises(ValidationError, match=r"vdb\.databases\[1\] \(milvus\)"):
        VdbConfig.model_validate(
            {"databases": [{"name": "qdrant"}, {"name": "milvus"}], "collection": {"quantization": "bq"}}
        )


def test_every_database_declares_what_it_builds() -> None:
    for name in DATABASES:
        assert quantizations(name, "hnsw")[0] == "none"  # uncompressed is always there first
        assert set(on_disk_index_types(name)) <= set(get_args(IndexType))
    assert quantizations("milvus", "ivf_flat") == ("none", "scalar")
    assert on_disk_index_types("weaviate") == ("flat",)


def test_qdrant_pq_ratio_follows_the_code_count() -> None:
    assert pq_ratio(784, 196) == 16  # 4 dims per 8-bit code: 16 bytes of floats per byte
    assert pq_ratio(784, 16) == 64  # 196x wanted: Qdrant's largest is x64
    assert pq_ratio(384, 384) == 4 and pq_ratio(1024, 128) == 32
