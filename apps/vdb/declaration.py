"""The typed declaration every database makes of itself: ``DATABASE = Database(...)`` in its folder's
``__init__.py``, found through the registry (:mod:`apps.vdb`).

The declaration holds data (its settings model, client packages, index types, images, ...) and names the
code that runs it (deployment, client, HPC ranks and checks) by import path, as :class:`Lazy` callables:
declaring a database, validating a config or planning an HPC job imports no client library, and a worker
imports only the parts of the database it talks to.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Lazy:
    """A callable named by its import path, ``"package.module:attribute"``, imported at its first call."""

    path: str

    def __post_init__(self) -> None:
        module, sep, attribute = self.path.partition(":")
        if not (module and sep and attribute):
            raise ValueError(f"{self.path!r}: expected 'package.module:attribute'")

    def load(self) -> Callable[..., Any]:
        """The callable itself (importing its module)."""
        module, _, attribute = self.path.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call it (``Lazy("m:f")(x)`` is ``m.f(x)``)."""
        return self.load()(*args, **kwargs)


@dataclass(frozen=True)
class Database:
    """Everything the pipeline knows about one database, in one place.

    ``in_process`` says where the engine runs: ``True`` for a library that only ever runs inside its clients
    (no server, hence no ``ranks``, ``image_field`` or ``images``, never a pilot job), ``False`` for a
    server, or a predicate on the settings for a database that can be either (Qdrant: ``mode: edge``).
    """

    name: str
    settings: type  # its pydantic settings model (``vdb.databases`` entries, discriminated by ``name``)
    packages: tuple[str, ...]  # client packages whose versions the provenance records (PyPI names)
    index_types: tuple[str, ...]  # the ``vdb.collection.index_type`` values it builds
    deployment: Lazy  # deployment(settings) -> Deployment
    client: Lazy  # client(settings, endpoints, client_index=0) -> Client on endpoints.entry(client_index)
    in_process: bool | Callable[[Any], bool] = False
    # The quantisations each index type builds with (an index type absent here: only "none").
    quantizations: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    on_disk: tuple[str, ...] = ()  # index types that honour ``vdb.collection.on_disk: true``
    always_on_disk: tuple[str, ...] = ()  # index types on disk whatever on_disk says (the report's medium)
    limits: Mapping[str, str] = field(default_factory=dict)  # field -> why other values are refused
    # Builds its index as vectors arrive, with no deferred build: its index stage times what is left queued.
    indexes_on_upload: bool = False
    # local_ranks(settings) -> the server processes a local deployment starts (a local cluster); None: one.
    local_ranks: Callable[[Any], int] | None = None
    # index_problems(settings, collection, cluster) -> [(field, message)]: refusals beyond the tables above.
    index_problems: Callable[[Any, Any, Any], list[tuple[str, str]]] | None = None
    # with_threads(settings, n) -> its settings with its own thread knobs set for n cores (None: no knobs).
    with_threads: Callable[[Any, int], Any] | None = None
    # Apptainer images it runs from on HPC (``vdb.cluster.images`` keys), with what each holds.
    images: Mapping[str, str] = field(default_factory=dict)
    ranks: Lazy | None = None  # plan_ranks(settings, cluster, image, data, base_dir) -> RankPlan
    image_field: Lazy | None = None  # image_field(cluster, settings=None) -> the vdb.cluster.images key
    settings_checks: Lazy | None = None  # settings_problems(settings, index, shards) -> [Problem]
    cluster_checks: Lazy | None = None  # cluster_problems(ClusterCheck) -> [Problem]

    def __post_init__(self) -> None:
        served = self.ranks is not None and self.image_field is not None and bool(self.images)
        if self.in_process is True and (self.ranks or self.image_field or self.images):
            raise ValueError(f"{self.name}: an engine that only runs in process has no ranks or images")
        if self.in_process is not True and not served:
            raise ValueError(f"{self.name}: a database with a server declares ranks, image_field and images")
        for index_types in (self.on_disk, self.always_on_disk, tuple(self.quantizations)):
            if not set(index_types) <= set(self.index_types):
                raise ValueError(f"{self.name}: {sorted(index_types)} are not all in index_types")

    @property
    def served(self) -> bool:
        """True when it can run as a server (a pilot job on HPC), False for an in-process-only library."""
        return self.in_process is not True

    def runs_in_process(self, settings: Any) -> bool:
        """True when these settings run the engine inside the client process (no server to deploy)."""
        return self.in_process(settings) if callable(self.in_process) else self.in_process

    def threads(self, settings: Any, cores: int) -> Any:
        """Its settings with its own thread knobs set for ``cores`` (values the user set win); a database
        without thread knobs keeps its settings: only the CPU affinity applies to it."""
        return self.with_threads(settings, cores) if self.with_threads is not None else settings

    def builds_with(self, index_type: str) -> tuple[str, ...]:
        """The quantisations it builds ``index_type`` with (uncompressed first)."""
        return tuple(self.quantizations.get(index_type, ("none",)))

    def plan_ranks(self, settings: Any, cluster: Any, image: str, data: str, base_dir: Any) -> Any:
        """Its ranks on an HPC pilot job (a ``RankPlan``)."""
        if self.ranks is None:
            raise ValueError(f"{self.name} runs inside its clients: it has no ranks")
        return self.ranks(settings, cluster, image, data, base_dir)

    def image_for(self, cluster: Any, settings: Any = None) -> str:
        """The ``vdb.cluster.images`` field it runs from on this cluster block (and these settings)."""
        if self.image_field is None:
            raise ValueError(f"{self.name} runs inside its clients: it has no image")
        return self.image_field(cluster, settings)

    def settings_problems(self, settings: Any, index: int, shards: int) -> list[Any]:
        """Its own checks of ``vdb.databases[index]`` under ``vdb.cluster`` (``shards``:
        ``vdb.collection.shards``)."""
        return self.settings_checks(settings, index, shards) if self.settings_checks is not None else []

    def cluster_problems(self, check: Any) -> list[Any]:
        """Its own checks of its cluster layout (a ``ClusterCheck``)."""
        return self.cluster_checks(check) if self.cluster_checks is not None else []
