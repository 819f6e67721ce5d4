"""Config strings that end up in a shell: one strict pattern per kind of value (pydantic only).

Parsl builds the submit command (``qsub -q QUEUE -A ACCOUNT script``) as one shell string, writes the
``#PBS``/``#SBATCH`` header, the launcher line and the worker command (inside an unquoted here-document)
without quoting, and the database ranks run rendered bash scripts. A value that reaches any of these is
therefore checked here against the characters its kind needs and nothing more: no whitespace where a word
is expected, no newline anywhere (it would end a ``#PBS`` line and start a command), no ``$`` ``` ` ```
``;`` ``&`` ``|`` quotes or parentheses where the shell would read them. Free text that a shell only
receives quoted (environment values, extra ``apptainer`` arguments) only has to be free of control bytes.
``worker_init`` lines are shell by design and are not checked.

Each type raises a ``ValueError`` whose message says what is allowed; the config loader adds the file,
line, field path and the rejected value.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import parse_qs, urlsplit

from pydantic import AfterValidator


def _pattern(regex: str, allowed: str) -> AfterValidator:
    """A validator accepting exactly the strings ``regex`` matches in full (a trailing newline too fails)."""
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"must be {allowed}")
        return value

    return AfterValidator(check)


# Queue, account, partition, QoS: scheduler names; they reach `qsub -q/-A` on the login node's shell.
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.,@+-]*"
_NAME_CHARS = "letters, digits and _ . , @ + - (not starting with -)"
SchedulerName = Annotated[str, _pattern(_NAME, f"a scheduler name: {_NAME_CHARS}")]
# A blank account passes here: the platform check then says that an account is required.
Account = Annotated[str, _pattern(f" *|{_NAME}", f"an account name: {_NAME_CHARS}")]
# Slurm node features: '&', '|', '[]', '*' and '()' are its syntax; Parsl writes them only into an
# '#SBATCH --constraint=' header line, which no shell reads, so only whitespace and control bytes harm.
SlurmConstraint = Annotated[
    str,
    _pattern(
        r"[A-Za-z0-9_.,:=&|*!()\[\]-]+",
        "a Slurm constraint: letters, digits and _ . , : = & | * ! ( ) [ ] - without spaces",
    ),
]
# PBS resources appended to '#PBS -l select=N:ncpus=C' (e.g. ngpus=4, or ngpus=4:mem=200gb).
PbsSelect = Annotated[
    str,
    _pattern(r"[A-Za-z0-9_.=:+,@-]*", "PBS select resources such as ngpus=4:mem=200gb (no spaces)"),
]
# '#PBS -l place=...' (scatter, scatter:excl, pack, free, group=rack).
PbsPlace = Annotated[str, _pattern(r"[A-Za-z0-9_.=:-]+", "a PBS placement such as scatter or scatter:excl")]
# One entry of '#PBS -l filesystems=a:b' (home, eagle, flare, daos_user_fs).
PbsFilesystem = Annotated[
    str, _pattern(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", "a file system name: letters, digits and _ . -")
]
_DIRECTIVE = r"[ \t][^\x00-\x1f\x7f]*"
PbsDirective = Annotated[
    str, _pattern(r"#PBS" + _DIRECTIVE, "one '#PBS ...' directive line (no newline or control byte)")
]
SlurmDirective = Annotated[
    str, _pattern(r"#SBATCH" + _DIRECTIVE, "one '#SBATCH ...' directive line (no newline or control byte)")
]
# The database job's lines: the platform decides which prefix applies (checked at plan time).
Directive = Annotated[
    str,
    _pattern(r"#(PBS|SBATCH)" + _DIRECTIVE, "one '#PBS ...' or '#SBATCH ...' directive line (no newline)"),
]
# A network interface name (Linux allows 15 bytes): bond0, hsn0, ib0, enp0s31f6, eth0.100.
Interface = Annotated[
    str,
    _pattern(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,14}", "an interface name such as hsn0 (15 characters at most)"),
]
# An address the interchange listens on: an IPv4/IPv6 address or a host name.
Address = Annotated[str, _pattern(r"[A-Za-z0-9_.:-]+", "an IP address or host name")]
# mpiexec/srun options inserted into the launcher line unquoted: option words separated by spaces.
LauncherArgs = Annotated[
    str,
    _pattern(
        r"[A-Za-z0-9_=:.,/+%@ -]*",
        "launcher options such as '--depth=64 --ppn 1': letters, digits, spaces and _ = : . , / + % @ -",
    ),
]
LauncherOption = Annotated[str, _pattern(r"--?[A-Za-z][A-Za-z0-9_-]*", "one option name such as --cpu-bind")]


def _check_accelerators(value: int | list[str]) -> int | list[str]:
    if isinstance(value, int) and value < 0:
        raise ValueError("accelerators must be a count >= 0 (0: a CPU-only node) or a list of ids")
    for item in [] if isinstance(value, int) else value:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", item):
            raise ValueError(f"accelerator id {item!r} must be letters, digits and _ . : - such as 0 or 0.1")
    return value


# A GPU count, or ids that reach the worker command ('0'..'3', Aurora tiles '0.0'..'5.1', UUIDs); checked
# after the union so that a bad id gets one message, not one per union member.
Accelerators = Annotated[int | list[str], AfterValidator(_check_accelerators)]
# Paths written into job scripts and bind specs: no whitespace, no shell syntax, no ':' or ',' (apptainer
# --bind separators), not starting with '-' (it would read as an option).
_SAFE_PATH = r"[\w./+@%~][\w./+@%~-]*"
_SAFE_PATH_CHARS = "letters, digits and _ . / + @ % ~ - (no spaces, quotes, $, : or ,; not starting with -)"
SafePath = Annotated[str, _pattern(_SAFE_PATH, f"a path of {_SAFE_PATH_CHARS}")]
# DAOS pool and container labels, also formatted into the mount command.
DaosLabel = Annotated[
    str, _pattern(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", "a DAOS label: letters, digits and _ . -")
]
# Free text the scripts only ever receive quoted; a newline or control byte has no legitimate use there.
PlainText = Annotated[str, _pattern(r"[^\x00-\x1f\x7f]*", "one line of text without control characters")]
# An environment variable's name, as the servers' env files and `export` lines write it.
EnvName = Annotated[
    str, _pattern(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name: letters, digits and _")
]


class SecretValueError(ValueError):
    """A refused value that holds a secret: the config loader prints the message, never the value."""


def check_server_url(value: str, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """A URL of one of ``schemes`` naming its host: ``weaviate:8080`` would otherwise parse as scheme
    ``weaviate`` with no host, and the client would silently try 127.0.0.1."""
    parts = urlsplit(value)  # the scheme comes back in lower case
    try:
        port = parts.port  # a port that is not a number, or beyond 65535, raises here
    except ValueError:
        port = 0
    # "host:" (an empty port) parses as no port at all, which would mean the scheme's default
    empty_port = parts.netloc.endswith(":")  # also "[::1]:"
    if (
        parts.scheme not in schemes
        or not parts.hostname
        or port == 0
        or empty_port
        or re.search(r"[\s\x00-\x1f\x7f]", value)
    ):
        raise ValueError(
            f"must be a server URL such as {schemes[0]}://host:8080 ({' or '.join(schemes)}, a host, a port "
            "1-65535)"
        )
    return no_password_in_url(value)


def with_port(value: str) -> str:
    """A URL that names its port: where the scheme's default port is not the server's, leaving it out
    is ambiguous."""
    if urlsplit(value).port is None:
        raise ValueError("must name its port, as http://host:8080")
    return value


def no_password_in_url(value: str) -> str:
    """A URL with a password in it is refused: the resolved config is written into the run's provenance."""
    parts = urlsplit(value)
    # libpq also takes ?password= (and sslpassword=, a client key's passphrase)
    if parts.password is not None or any("password" in key.lower() for key in parse_qs(parts.query)):
        raise SecretValueError(
            "must not hold a password (the config is recorded in the run's provenance): put it in an "
            "environment variable and name that in the database's *_env setting"
        )
    return value


# The URL of a running server the run attaches to (instead of starting one).
ServerUrl = Annotated[str, AfterValidator(check_server_url)]


def safe_path_problem(path: str) -> str | None:
    """Why ``path`` (e.g. a resolved work directory) cannot go into a job script, or None when it can."""
    if re.fullmatch(_SAFE_PATH, path):
        return None
    return f"{path!r} cannot be written into job scripts: use a path of {_SAFE_PATH_CHARS}"
