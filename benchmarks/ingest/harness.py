"""The harness side of ``benchmarks.ingest``: the project's insert stage, and ``--profile``."""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from typing import Any

from benchmarks.common.vdb import CpuMeter, target_of
from benchmarks.ingest.vendors import vendor_upload

# --- the harness: the project's insert stage ---------------------------------------------------------------


def harness_upload(ctx: dict[str, Any], clients: int) -> dict[str, Any]:
    """prepare_collection (fresh) -> insert_partition -> wait_searchable, as a pipeline run does.

    insert_partition keeps its client processes for the next upload of this process (the stage's next
    batch size; here the next repeat): the first upload of an arm starts them, before its clock starts.
    """
    from apps.vdb.stages.insert import insert_partition, prepare_collection, wait_searchable

    target = target_of(ctx)
    prepare_collection(target, True)
    cpu = CpuMeter(ctx["server_pids"])
    called = time.time()
    record = insert_partition(target, ctx["data"]["units"], ctx["batch_size"], clients, ctx["retries"])
    returned = time.time()
    visible = wait_searchable(target, len(ctx["data"]["ids"]), ctx["timeout"], record)
    done = time.time()
    first, last, searchable_at = record.first_start, record.last_end, visible.searchable_at
    return {
        "rows": record.rows,
        "clients": record.clients,
        "batches": record.batches,
        "retried": record.retried,
        "upload_s": searchable_at - first,
        "send_s": last - first,
        "visible_s": searchable_at - last,
        "return_s": returned - last,  # last request -> insert_partition returned (pool kept or closed)
        "wait_searchable_s": done - returned,  # the wait_searchable call, verification included
        "startup_s": first - called,  # insert_partition called -> first request (pool start, connect)
        "wall_s": max(searchable_at, done) - called,
        "count": visible.count,
        **cpu.read(),
    }


# --- profiling (``--profile``) -----------------------------------------------------------------------------


def _top(profile: cProfile.Profile, n: int = 14) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(n)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    head = next((ln.strip() for ln in lines if "function calls" in ln), "")
    return "\n".join([f"    {head}", *(f"    {ln}" for ln in lines[start:])])


def _time_first_client() -> dict[str, float]:
    """Pool function: what the first batch of a fresh client process pays before its first request."""
    from apps.vdb import pool

    started = time.perf_counter()
    pool.client()
    return {"lazy_connect_s": time.perf_counter() - started}


def profile_database(ctx: dict[str, Any], vendor: Any, mode: str) -> dict[str, Any]:
    """cProfile of one client's insert loop (harness's insert_units vs the vendor path) in this process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from apps.vdb import pool
    from apps.vdb.stages.insert import insert_units, prepare_collection

    target = target_of(ctx)
    result: dict[str, Any] = {}
    if not ctx["endpoints_model"].in_process:
        with ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=pool.connect, initargs=(target,)
        ) as executor:
            result.update(executor.submit(_time_first_client).result())
    prepare_collection(target, True)
    pool.connect(target)
    harness = cProfile.Profile()
    started = time.perf_counter()
    harness.runcall(insert_units, ctx["data"]["units"], ctx["batch_size"], 0)
    result["harness_loop_s"] = time.perf_counter() - started
    pool.disconnect()
    vendor_profile = cProfile.Profile()
    started = time.perf_counter()
    vendor_profile.runcall(vendor_upload, ctx, vendor, mode)
    result["vendor_upload_s"] = time.perf_counter() - started
    result["harness_top"], result["vendor_top"] = _top(harness), _top(vendor_profile)
    return result
