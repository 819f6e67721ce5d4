"""Every batch job the Parsl blocks submit, recorded as it appears, so a later run can cancel what a killed
driver left queued or running (:func:`core.lifetime.stop_leftovers`)."""

from __future__ import annotations

import threading
from typing import Any

from core.lifetime import record_job
from executors.providers import cancel_command


class BlockJobRecorder:
    """A driver thread that records each new block job of ``executors`` every ``every`` seconds."""

    def __init__(self, executors: list[Any], every: float = 5.0) -> None:
        self.executors, self.every = executors, every
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="block-job-recorder", daemon=True)

    def __enter__(self) -> BlockJobRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every + 1)

    def record_new(self) -> None:
        """Record the jobs submitted since the last call."""
        for executor in self.executors:
            command = cancel_command(getattr(executor, "provider", None))
            jobs = dict(getattr(executor, "blocks_to_job_id", {}) or {})
            for block, job in jobs.items():
                if command and job and job not in self.seen:
                    self.seen.add(job)
                    record_job(f"parsl block {executor.label}.{block}", str(job), command)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.record_new()
