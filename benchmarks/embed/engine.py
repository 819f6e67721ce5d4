"""Driver side of ``python -m benchmarks.embed``'s engine children: start one, sample its RSS, send it
rounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import common

EMBED_MODULE = __package__  # ``python -m benchmarks.embed --engine`` (from the repository root): the child


class EngineFailed(SystemExit):
    """An engine child ended before answering: its log's tail says why (uncaught, it ends the benchmark)."""

    def __init__(self, kind: str, returncode: int | None, tail: str) -> None:
        super().__init__(f"{kind} side failed (exit {returncode}):\n{tail}")
        self.kind, self.tail = kind, tail

    @property
    def reason(self) -> str:
        """The last line of the child's error, e.g. ``ModuleNotFoundError: No module named 'optimum'``."""
        lines = [line.strip() for line in self.tail.splitlines() if line.strip()]
        return lines[-1] if lines else "no output"


class Engine:
    """Driver side of an engine child: start it, sample its process tree's RSS, send rounds."""

    def __init__(self, kind: str, spec: dict[str, Any], tmp: Path) -> None:
        self.kind = kind
        spec_file, self.log = tmp / f"{kind}-spec.json", tmp / f"{kind}.log"
        spec_file.write_text(json.dumps(spec))
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", EMBED_MODULE, "--engine", kind, str(spec_file)],
                cwd=common.REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self.sampler = common.TreeSampler(self.proc.pid, own_children=[self.proc.pid]).__enter__()
        self.info = self._reply()

    def _reply(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.sampler.__exit__(None, None, None)
            raise EngineFailed(self.kind, self.proc.returncode, self.log.read_text()[-4000:])
        return json.loads(line)

    def run(self, vectors_file: Path) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps({"vectors": str(vectors_file)}) + "\n")
        self.proc.stdin.flush()
        result = self._reply()
        result["chunks_per_s"] = result["chunks"] / result["seconds"]
        result["chunks_per_cpu_s"] = result["chunks"] / result["cpu_seconds"]
        return result

    def close(self) -> dict[str, Any]:
        """Stop the child; return its tree's peak RSS over the whole session."""
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=120)
        self.sampler.__exit__(None, None, None)
        return {
            "peak_rss_mib": round(common.mib(self.sampler.peak), 1),
            "peak_processes": self.sampler.peak_processes,
            "peak_breakdown": self.sampler.peak_breakdown,
            "per_process": per_process_peaks(self.sampler.timeline),
        }


def per_process_peaks(timeline: list[tuple[float, list[tuple[int, str, int]]]]) -> list[dict[str, Any]]:
    """Each process's own peak RSS over the session (the tree's peak sums processes at one instant)."""
    peaks: dict[int, tuple[str, int]] = {}
    for _, rows in timeline:
        for pid, role, rss in rows:
            if rss > peaks.get(pid, ("", -1))[1]:
                peaks[pid] = (role, rss)
    return [
        {"pid": pid, "role": role, "peak_rss_mib": round(common.mib(rss), 1)}
        for pid, (role, rss) in sorted(peaks.items(), key=lambda item: -item[1][1])
    ]
