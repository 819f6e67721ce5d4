"""``python -m pipeline dataset import|export|geometry|synth``: ANN datasets in and out of the project's
layout, their geometry, and synthetic ones shaped like a real one."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Literal

import typer

from core.errors import PipelineError, os_message
from core.store import SAFE_NAME, SAFE_NAME_RULE, ensure_writable_dir, os_error_reason
from pipeline.cli.output import console, out, warn
from pipeline.cli.output import error as _error
from pipeline.cli.output import fail as _fail
from pipeline.runs import default_workdir

# The arguments `export` and `geometry` share: the dataset, and where its queries and ground truth are.
DatasetDir = Annotated[
    Path, typer.Argument(metavar="DATASET_DIR", help="A dataset folder (store/datasets/...)")
]
QueriesFile = Annotated[
    Path | None, typer.Option(help="queries.parquet or its folder (pipeline-built datasets)")
]
GroundtruthFile = Annotated[
    Path | None, typer.Option(help="groundtruth.parquet or its folder (pipeline-built datasets)")
]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Import an ANN benchmark dataset (with its queries and ground truth), export one, draw a "
    "synthetic one like it (synth), or measure its geometry.",
)


def _writable_store(root: Path, store: Path) -> None:
    """End the command (exit 2) unless the store's folders a dataset is written into can be made there:
    a file in their place, a read-only disk, an unwritable workdir."""
    for folder in (store / "datasets", store / "locks" / "datasets"):
        try:
            ensure_writable_dir(folder)
        except OSError as exc:
            _error(f"cannot create the store under {root}: {os_error_reason(exc, folder)}", 2)


def _remove_made(made: list[Path], store: Path, folder: Path) -> None:
    """After a failed or interrupted import, the store folders this command made (the import removed its
    own temporary folder): a bad base row found while streaming leaves the workdir as it was."""
    if not made:  # the store was there before: its folders may be another import's
        return
    from apps.interchange.importer import import_lock

    import_lock(folder).unlink(missing_ok=True)
    for empty in (store / "datasets", store / "locks" / "datasets", store / "locks", *made):
        with contextlib.suppress(OSError):  # not empty: something else writes there too; kept
            empty.rmdir()


@app.command("import")
def import_(
    fmt: Annotated[
        str,
        typer.Argument(
            metavar="FORMAT", help="hdf5, vecs (fvecs/bvecs), bin (fbin/u8bin/i8bin), npy or vdbbench"
        ),
    ],
    paths: Annotated[
        list[Path],
        typer.Argument(
            metavar="PATHS...",
            help="base, queries and ground-truth files in that order, or one folder (one .hdf5 file)",
        ),
    ],
    name: Annotated[str, typer.Option(help="Dataset name (store/datasets/<name>-<key>/)")],
    metric: Annotated[
        Literal["l2", "ip", "cosine"] | None,
        typer.Option(help="Distance of the ground truth (default: the file's, else l2)"),
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Root of store/ (default: $PIPELINE_WORKDIR or the current folder)")
    ] = None,
    rows_per_part: Annotated[int, typer.Option(min=1, help="Base rows per part file")] = 1_000_000,
) -> None:
    """Import a dataset and check its published ground truth against exact search."""
    import re

    from apps.interchange.importer import import_target, run_import

    if not re.fullmatch(SAFE_NAME, name):
        _error(f"--name {name!r}: use {SAFE_NAME_RULE}", 2)
    root = workdir or default_workdir()
    store = root.expanduser().resolve() / "store"
    try:
        target = import_target(fmt, paths, name, store, metric, rows_per_part)  # files checked: nothing made
    except PipelineError as exc:
        _fail(exc)
    except OSError as exc:  # a file that vanished or cannot be read while it is hashed
        _error(f"reading the input: {os_message(exc)}", 3)
    if target.rows_note:  # said now: a user who named the wrong files need not wait for the import
        warn(target.rows_note)
    made = [p for p in (store, *store.parents) if not p.exists()]  # removed again if the import fails
    _writable_store(root, store)
    try:
        result = run_import(target, name, rows_per_part)
    except PipelineError as exc:
        _remove_made(made, store, target.directory)
        _fail(exc)
    except OSError as exc:  # the store failing mid-way (disk full, quota): not the input's fault
        _remove_made(made, store, target.directory)
        _error(f"importing into {store}: {os_message(exc)}", 1)
    except KeyboardInterrupt:  # Ctrl-C: the staged folder is gone already; so are the folders made for it
        _remove_made(made, store, target.directory)
        raise
    manifest, check = result.manifest, result.check
    state = "already imported" if result.cached else "imported"
    out.print(
        f"{state}: {result.directory}\n"
        f"  {manifest['rows']:,} vectors x {manifest['dimension']} ({manifest['import']['source_dtype']}), "
        f"{manifest['queries']['count']:,} queries, top-{manifest['groundtruth']['k']} ground truth, "
        f"metric {manifest['metric']}",
        highlight=False,
        soft_wrap=True,
    )
    for line in manifest.get("warnings", []):  # the ground-truth check's, zero vectors under cosine
        if line != target.rows_note:
            warn(line)
    if not check["disagree"]:  # a disagreement was one of the warnings above
        out.print(
            f"  ground truth agrees with exact search up to ties: "
            f"{check['agree_up_to_ties']}/{check['queries']} queries ({check['identical']} identical lists)",
            highlight=False,
            soft_wrap=True,
        )


@app.command("export")
def export(
    dataset_dir: DatasetDir,
    fmt: Annotated[
        str, typer.Argument(metavar="FORMAT", help="fvecs, bvecs, fbin, u8bin, i8bin, npy, hdf5 or vdbbench")
    ],
    out_dir: Annotated[Path, typer.Argument(metavar="OUT_DIR", help="New or empty output folder")],
    queries: QueriesFile = None,
    groundtruth: GroundtruthFile = None,
    metric: Annotated[
        Literal["l2", "ip", "cosine"] | None, typer.Option(help="Override the ground truth's metric")
    ] = None,
) -> None:
    """Export a dataset with its queries and ground truth so other tools can run on it."""
    from apps.interchange.exporter import export_dataset, locate

    try:
        written = export_dataset(locate(dataset_dir, queries, groundtruth, metric), fmt, out_dir)
    except PipelineError as exc:
        _fail(exc)
    except OSError as exc:
        _error(f"exporting to {out_dir}: {os_message(exc)}", 1)
    out.print(
        f"exported {written['rows']:,} vectors x {written['dim']}, {written['queries']:,} queries, "
        f"top-{written['k']} ({written['metric']}) as {fmt}: {written['dir']}: {', '.join(written['files'])}",
        highlight=False,
        soft_wrap=True,
    )


@app.command("geometry")
def geometry(
    dataset_dir: DatasetDir,
    queries: QueriesFile = None,
    groundtruth: GroundtruthFile = None,
    metric: Annotated[
        Literal["l2", "ip", "cosine"] | None, typer.Option(help="The metric, when nothing recorded it")
    ] = None,
    sample_rows: Annotated[int, typer.Option(help="Rows (and queries) sampled at most")] = 5000,
    k: Annotated[int, typer.Option(help="Neighbours per point for the LID (MLE)")] = 20,
    seed: Annotated[int, typer.Option(help="Seed of the sample")] = 0,
    write_card: Annotated[
        bool, typer.Option("--write-card", help="Also put the figures into the dataset's README.md")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON")] = False,
) -> None:
    """Print the intrinsic dimension (MLE, TwoNN) and relative contrast of a dataset and its queries."""
    from pydantic import ValidationError

    from apps.dataset.geometry.estimates import GeometryConfig, dataset_geometry
    from apps.dataset.geometry.stage import summary_lines, update_card
    from apps.interchange.exporter import locate

    try:
        config = GeometryConfig(sample_rows=sample_rows, k=k, seed=seed)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "k"
        _error(f"--{field.replace('_', '-')}: {first['msg']}", 2)
    try:
        found = locate(dataset_dir, queries, groundtruth, metric)
        record = dataset_geometry(
            found.dataset_dir, found.queries_file, found.groundtruth_file, found.metric, config
        )  # type: ignore[arg-type]
    except PipelineError as exc:
        _fail(exc)
    if write_card and not update_card(found.dataset_dir, record):
        warn(f"could not write {found.dataset_dir / 'README.md'}")
    if as_json:
        out.print_json(record.model_dump_json())
        return
    for line in summary_lines(record, found.name):
        out.print(line, highlight=False, soft_wrap=True)


@app.command("synth")
def synth(
    like: Annotated[
        str, typer.Option(help="The real dataset to imitate: its name in the store, or its folder")
    ],
    rows: Annotated[int, typer.Option(min=1, help="Vectors to draw")],
    name: Annotated[str | None, typer.Option(help="Dataset name (default: <like>-synth-<rows>)")] = None,
    queries: Annotated[int, typer.Option(min=1, help="Queries to draw")] = 1000,
    k: Annotated[int, typer.Option(min=1, max=10000, help="Exact neighbours per query")] = 100,
    components: Annotated[
        int | None,
        typer.Option(
            min=1, help="Gaussian mixture components (default: one per 128 real rows fitted, at most 64)"
        ),
    ] = None,
    pca_dims: Annotated[
        int | None,
        typer.Option(
            min=1, help="Principal directions the mixture lives in (default: 24, at most the dimension)"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="Seed: the same arguments draw the same vectors")] = 0,
    workdir: Annotated[
        Path | None, typer.Option(help="Root of store/ (default: $PIPELINE_WORKDIR or the current folder)")
    ] = None,
) -> None:
    """Draw a SYNTHETIC dataset shaped like a real one (for sizes no real dataset here reaches)."""
    import re

    from apps.interchange.synth import (
        FIT_ROWS,
        LID_K,
        LID_TOLERANCE,
        SynthSpec,
        bytes_needed,
        default_components,
        synthesize,
    )
    from core.format import size
    from core.store import read_manifest
    from pipeline.given_dataset import stored_candidates, stored_names
    from pipeline.resources import disk_usage

    root = workdir or default_workdir()
    store = root.expanduser().resolve() / "store"
    folder = Path(like).expanduser()
    if not folder.is_dir():
        found = stored_candidates(store, like)
        if not found and (damaged := stored_candidates(store, like, complete=False)):
            _error(
                f"--like {like!r}: {damaged[0]} is damaged (its files do not match its manifest); remove it",
                4,
            )
        if len(found) != 1:
            what = (
                f"no dataset of that name in {store / 'datasets'} ({stored_names(store)})"
                if not found
                else f"{len(found)} datasets of that name ({', '.join(p.name for p in found)})"
            )
            _error(f"--like {like!r}: {what}; name its folder", 2)
        folder = found[0]
    try:
        like_manifest = read_manifest(folder)
    except PipelineError:  # damaged
        like_manifest = None
    if not isinstance(like_manifest, dict) or like_manifest.get("stage") != "embed":
        _error(f"--like {like!r}: {folder} is not a dataset (no dataset manifest.json in it)", 2)
    dimension = int(like_manifest.get("dimension") or 0)
    if pca_dims is None:
        pca_dims = min(24, dimension)
    elif pca_dims > dimension:
        _error(f"--pca-dims {pca_dims} exceeds the real dataset's dimension {dimension}", 2)
    if k > rows:
        _error(f"--k {k} exceeds --rows {rows}", 2)
    if rows <= LID_K:  # the check that the drawn set is shaped like the real one needs more
        _error(
            f"--rows {rows}: draw at least {LID_K + 1} (the intrinsic-dimension check takes k = {LID_K})", 2
        )
    if components is None:
        components = default_components(int(like_manifest.get("rows") or 0))
    elif components * 2 > min(like_manifest.get("rows") or 0, FIT_ROWS):
        _error(
            f"--components {components}: the real dataset offers {like_manifest.get('rows', 0):,} rows "
            f"to fit them to; use at most half as many components as rows (and at most {FIT_ROWS // 2:,})",
            2,
        )
    if name is None:  # <real name>-synth-<rows>
        like_name = (like_manifest.get("metadata") or {}).get("dataset_name") or folder.name
        name = f"{re.sub(r'[^A-Za-z0-9._-]+', '-', like_name).lstrip('._-') or 'dataset'}-synth-{rows}"
    if not re.fullmatch(SAFE_NAME, name):
        _error(f"--name {name!r}: use {SAFE_NAME_RULE}", 2)
    _writable_store(root, store)
    spec = SynthSpec(rows, queries, k, components, pca_dims, seed)

    def room_for_it() -> None:  # refused before a row is drawn, not when the disk fills hours in
        need, free = bytes_needed(spec, dimension), disk_usage(store).free
        if need > free:
            _error(
                f"--rows {rows:,}: {rows:,} x {dimension} float32 vectors take about {size(need)}; "
                f"{size(free)} free in {store}",
                2,
            )

    say = lambda line: console.print(line, highlight=False)  # noqa: E731
    try:
        directory, manifest, cached = synthesize(
            folder, name, store, spec, say=say, before_drawing=room_for_it
        )
    except PipelineError as exc:
        _fail(exc)
    except OSError as exc:  # the store failing mid-way (disk full, quota): nothing is left half-written
        _error(f"writing into {store}: {os_message(exc)}", 1)
    lid = manifest["synthetic"]["lid"]
    off = lid["synthetic"] / lid["real"] - 1
    out.print(
        f"{'already drawn' if cached else 'drew'} SYNTHETIC dataset: {directory}\n"
        f"  {manifest['rows']:,} vectors x {manifest['dimension']}, "
        f"{manifest['queries']['count']:,} queries, "
        f"exact top-{manifest['groundtruth']['k']}, metric {manifest['metric']}\n"
        f"  intrinsic dimension (MLE combined, k = {lid['k']}): synthetic {lid['synthetic']}, "
        f"real {lid['real']} ({off:+.0%})",
        highlight=False,
        soft_wrap=True,
    )
    if abs(off) > LID_TOLERANCE:  # not like it: searching it is easier or harder than the real one
        synth = manifest["synthetic"]
        warn(
            f"the synthetic set's intrinsic dimension is {off:+.0%} off the real one's (more than "
            f"±{LID_TOLERANCE:.0%}): its search difficulty differs; {synth['components']} components were "
            f"fitted to {synth['fit_rows']:,} rows, "
            + (
                "try fewer --components (they overfit)"
                if off < 0
                else "try more --components or fewer --pca-dims"
            )
        )
