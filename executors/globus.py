"""Start and watch runs on an HPC login node from a laptop, through any ``concurrent.futures.Executor``.

The Globus Compute ``Executor`` is one (``compute_executor(endpoint_id)``); tests pass a local
``ProcessPoolExecutor``. Two functions travel to the remote side:

* :func:`start_run` writes the configuration next to the remote checkout's ``configs/`` (so relative
  paths resolve as for any config there), starts ``python -m pipeline run`` detached (its own session:
  it outlives the function and the endpoint's worker), waits until the run directory exists and returns
  the run id;
* :func:`read_status` reads the run's ``provenance.json`` and stage manifests and says whether the
  process is still alive. A run id alone is enough for a run started by :func:`start_run`, which
  records where each run lives (``<checkout>/.submit/runs/<run id>.json``).

Both are self-contained (imports inside, plain arguments and results) so that every Globus Compute
serializer strategy, including source-based ones, can ship them.
"""

from __future__ import annotations

import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Any


def start_run(
    config_text: str | None,
    config_path: str | None,
    repo_dir: str | None,
    python: str | None = None,
    env: dict[str, str] | None = None,
    wait_s: float = 300.0,
    dataset: str | None = None,
) -> dict[str, Any]:
    """Remote side of ``submit``: start ``pipeline run`` detached (``--dataset dataset`` when given: an
    entry of the config's datasets section); return its run id and directory."""
    import hashlib
    import json
    import os
    import re
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    # The remote checkout: given, or $PES2O_REPO from the endpoint's worker_init.
    repo = Path(repo_dir or os.environ.get("PES2O_REPO") or ".").expanduser().resolve()
    if config_text is not None:
        digest = hashlib.sha256(config_text.encode()).hexdigest()[:12]
        config = repo / "configs" / f"submitted-{digest}.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(config_text, encoding="utf-8")
    elif config_path is not None:
        config = Path(config_path).expanduser()
        config = config if config.is_absolute() else repo / config
    else:
        raise ValueError("start_run needs config_text or config_path")
    logs = repo / ".submit"
    logs.mkdir(exist_ok=True)
    log = logs / f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    # Wide console: the run id line must not be wrapped by rich.
    child_env = {**os.environ, **(env or {}), "COLUMNS": "1000", "PYTHONUNBUFFERED": "1"}
    # Double fork: an intermediate process starts the run in its own session and exits at once, so the
    # run is adopted by init (which reaps it) instead of lingering as a zombie of the endpoint worker.
    spawn = (
        "import subprocess, sys, json; a = json.loads(sys.argv[1]); "
        "out = open(a['log'], 'ab'); "
        "p = subprocess.Popen(a['argv'], cwd=a['cwd'], stdout=out, stderr=subprocess.STDOUT, "
        "stdin=subprocess.DEVNULL, start_new_session=True); print(p.pid)"
    )
    exit_code = log.with_suffix(".exit")
    # A shell around the run records its exit code; the shell's pid is the run's lifetime.
    # "$3" is the dataset entry (empty: the file's own), passed as an argument, never pasted into the script.
    wrapper = '"$0" -m pipeline run "$1" ${3:+--dataset "$3"}; echo $? > "$2"'
    spec = {
        "argv": [
            "/bin/sh",
            "-c",
            wrapper,
            python or sys.executable,
            str(config),
            str(exit_code),
            dataset or "",
        ],
        "cwd": str(repo),
        "log": str(log),
    }
    launched = subprocess.run(
        [python or sys.executable, "-c", spawn, json.dumps(spec)],
        env=child_env,
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(launched.stdout.strip())
    try:  # its start time (clock ticks after boot, /proc/<pid>/stat field 22): a pid the system reuses later
        with open(f"/proc/{pid}/stat") as fh:  # names another process, which read_status must tell apart
            pid_start: str | None = fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        pid_start = None

    def alive() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as fh:  # a zombie has exited, whatever kill(0) says
                return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
        except OSError:
            try:
                os.kill(pid, 0)
                return True
            except ProcessLookupError:
                return False

    pattern = re.compile(r"^run (\S+) -> (.+?)\s*$", re.MULTILINE)
    deadline = time.monotonic() + wait_s
    while True:
        text = log.read_text(encoding="utf-8", errors="replace")
        match = pattern.search(text)
        if match:
            break
        if not alive():
            tail = "\n".join(text.splitlines()[-30:])
            code = exit_code.read_text().strip() if exit_code.exists() else "?"
            raise RuntimeError(f"pipeline run exited (code {code}) before starting:\n{tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"pipeline run did not create its run directory within {wait_s:.0f}s; see {log}"
            )
        time.sleep(0.5)
    run_id, run_dir = match.group(1), match.group(2)
    record = {
        "run_id": run_id,
        "run_dir": run_dir,
        "pid": pid,
        "pid_start": pid_start,
        "host": socket.gethostname(),
        "log": str(log),
        "config": str(config),
        "submitted": time.time(),
    }
    (Path(run_dir) / "submit.json").write_text(json.dumps(record, indent=2))
    index = repo / ".submit" / "runs"  # read_status finds the run by its id alone
    index.mkdir(exist_ok=True)
    (index / f"{run_id}.json").write_text(json.dumps(record, indent=2))
    return record


def read_status(workdir: str | None, run_ref: str, repo_dir: str | None = None) -> dict[str, Any]:
    """Remote side of ``status``: the run's state from provenance.json and its stages' manifests.

    ``run_ref`` is a run directory, or a run id: found under ``workdir``'s ``runs/`` when given (``~`` and
    ``$VARS`` expanded here, on the remote side), else in the checkout's record of submitted runs, else
    under ``$PIPELINE_WORKDIR``. A run not found has status ``unknown`` and an ``error`` saying where it
    was looked for.
    """
    import json
    import os
    import re
    import socket
    from pathlib import Path

    def expand(text: str, what: str) -> Path:
        expanded = os.path.expandvars(os.path.expanduser(text))
        unset = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expanded)
        if unset:
            raise LookupError(f"{what} {text!r}: ${unset[0]} is not set on {socket.gethostname()}")
        return Path(expanded)

    def unknown(run_dir: Path | None, error: str) -> dict:
        name = run_dir.name if run_dir is not None else run_ref
        return {"run_id": name, "run_dir": str(run_dir or ""), "status": "unknown", "error": error}

    repo = Path(repo_dir or os.environ.get("PES2O_REPO") or ".").expanduser()
    submitted = repo / ".submit" / "runs" / f"{run_ref}.json"  # what start_run recorded
    source = "--workdir"
    if not workdir and not submitted.is_file() and os.environ.get("PIPELINE_WORKDIR"):
        workdir, source = os.environ["PIPELINE_WORKDIR"], "$PIPELINE_WORKDIR"
    try:
        ref = expand(run_ref, "run")
        if ref.is_absolute():
            run_dir, source = ref, "the run directory given"
        elif workdir:
            base = expand(workdir, "workdir")
            run_dir = (base if base.is_absolute() else repo / base) / "runs" / run_ref
        elif submitted.is_file():
            record = json.loads(submitted.read_text())
            if not isinstance(record, dict) or not isinstance(record.get("run_dir"), str):
                return unknown(None, f"{submitted} names no run directory")
            run_dir, source = Path(record["run_dir"]), f"the record {submitted}"
        else:
            return unknown(
                None,
                f"no run {run_ref} was submitted from {repo.resolve()} on {socket.gethostname()} (no "
                f"{submitted.name} in {submitted.parent}); give its workdir (--workdir) or its run directory",
            )
    except LookupError as exc:  # a $VAR not set there
        return unknown(None, str(exc))
    except (OSError, ValueError) as exc:  # the record unreadable, or not JSON
        return unknown(None, f"{submitted}: {exc}")
    provenance = run_dir / "provenance.json"
    if not provenance.exists():
        where = f"{provenance} (from {source}) does not exist on {socket.gethostname()}"
        return unknown(run_dir, f"no run there: {where}")
    prov = json.loads(provenance.read_text())
    stages = {}
    for name, stage in prov.get("stages", {}).items():
        directory = Path(stage.get("directory", ""))
        stages[name] = {
            "key": stage.get("key"),
            "cached": stage.get("cached", False),
            "tasks": len(stage.get("tasks", [])),
            "finished": stage.get("finished") is not None,
            "manifest": (directory / "manifest.json").exists(),
            "directory": str(directory),
        }
    alive = None
    submit = run_dir / "submit.json"
    if submit.exists():
        record = json.loads(submit.read_text())
        if record.get("host") == socket.gethostname():  # a pid means something only on its own host
            pid = int(record["pid"])
            try:
                with open(f"/proc/{pid}/stat") as fh:  # a zombie has exited, whatever kill(0) says
                    fields = fh.read().rsplit(")", 1)[1].split()
                # Days later the pid may be another process's: the start time recorded at submit tells.
                started = record.get("pid_start")
                alive = fields[0] != "Z" and (started is None or fields[19] == started)
            except FileNotFoundError:
                alive = False
            except OSError:
                try:
                    os.kill(pid, 0)
                    alive = True
                except ProcessLookupError:
                    alive = False
                except PermissionError:
                    alive = True
    status = prov.get("status", "unknown")
    if status == "running" and alive is False:
        status = "lost"  # the driver died without recording an end (kill -9, node reboot)
    return {
        "run_id": prov.get("run_id", run_dir.name),
        "run_dir": str(run_dir),
        "status": status,
        "error": prov.get("error"),
        "started": prov.get("started"),
        "host": prov.get("host"),
        "alive": alive,
        "stages": stages,
        "outputs": prov.get("outputs", {}),
    }


def submit_run(
    executor: Executor,
    config_path: str | Path | None = None,
    *,
    config_text: str | None = None,
    remote_config: str | None = None,
    repo_dir: str | None = None,
    python: str | None = None,
    env: dict[str, str] | None = None,
    wait_s: float = 300.0,
    timeout: float | None = 600.0,
    dataset: str | None = None,
) -> dict[str, Any]:
    """Start a run through ``executor``; return its record (``run_id``, ``run_dir``, ``pid``, ``log``).
    ``dataset``: an entry of the config's ``datasets`` section (``run --dataset``).

    Give a local file (``config_path``; its text is sent), YAML text (``config_text``), or a path on
    the remote side (``remote_config``, relative to ``repo_dir`` there). ``repo_dir`` is the remote
    checkout the run starts in (default: ``$PES2O_REPO`` on the remote side, else its working
    directory); ``python`` the remote interpreter (default: the endpoint worker's).
    """
    if config_path is not None:
        config_text = Path(config_path).read_text(encoding="utf-8")
    if (config_text is None) == (remote_config is None):
        raise ValueError("give exactly one of config_path, config_text or remote_config")
    future = executor.submit(
        start_run, config_text, remote_config, repo_dir, python, env or {}, wait_s, dataset
    )
    return future.result(timeout=timeout)


def remote_status(
    executor: Executor,
    workdir: str | None,
    run_id: str,
    *,
    repo_dir: str | None = None,
    timeout: float | None = 300.0,
) -> dict[str, Any]:
    """The state of run ``run_id`` (or an absolute run directory) read on the remote side."""
    return executor.submit(read_status, workdir, run_id, repo_dir).result(timeout=timeout)


def wait_for(
    executor: Executor,
    workdir: str | None,
    run_id: str,
    *,
    repo_dir: str | None = None,
    timeout: float = 3600.0,
    poll_s: float = 10.0,
) -> dict[str, Any]:
    """Poll :func:`remote_status` until the run succeeded, failed or was lost (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        status = remote_status(executor, workdir, run_id, repo_dir=repo_dir)
        if status["status"] not in ("running", "unknown") or time.monotonic() > deadline:
            return status
        time.sleep(poll_s)


def compute_executor(endpoint_id: str, **kwargs: Any) -> Executor:
    """A Globus Compute Executor for ``endpoint_id`` (needs ``globus-compute-sdk`` and a login)."""
    from globus_compute_sdk import Executor as GlobusExecutor

    return GlobusExecutor(endpoint_id=endpoint_id, **kwargs)
