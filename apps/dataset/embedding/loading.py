"""Locating model and tokenizer files offline, and identifying them for content keys."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
from functools import cache
from pathlib import Path

from core.errors import InputDataError
from core.store import atomic_write_json, sha256_file

# Files that define a tokenizer's behaviour; their bytes identify it (models sharing them share chunks).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "spiece.model",
)


def offline_environment() -> None:
    """Never reach for a model hub: everything loads from local files."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Library chatter (weight-loading bars, "sequence longer than" notes) would drown the pipeline's log;
    # truncation is counted and reported by the pipeline itself.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def resolve_model_path(spec: str, base: Path | None = None) -> Path:
    """A model directory from a path or ``pkg:<module>`` (a package that ships weights in ``model/``).

    Raises InputDataError naming the spec when the directory or package does not exist.
    """
    if spec.startswith("pkg:"):
        module_name = spec[4:]
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            raise InputDataError(
                f"model {spec!r}: Python package {module_name!r} is not installed (pip install "
                f"{module_name.replace('_', '-')})"
            ) from None
        getter = getattr(module, "get_model_path", None)
        path = Path(getter()) if getter else Path(module.__file__).parent / "model"
    else:
        path = Path(spec).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
    if not path.is_dir():
        raise InputDataError(f"model {spec!r}: directory {path} does not exist")
    if not any((path / name).exists() for name in ("config.json", "tokenizer_config.json", "modules.json")):
        raise InputDataError(f"model {spec!r}: {path} holds no config.json/tokenizer_config.json")
    return path.resolve()


# Files of a model folder its embeddings cannot depend on: its documentation. Every other file counts
# (weights in any format, configs, tokenizer, custom code); hidden ones (a download tool's .cache/) do not.
DOC_SUFFIXES = {".md", ".rst"}
DIGEST_CACHE = "model-digests.json"  # each model file's sha256, by what its stat says of its content
_HASHED: dict[tuple, str] = {}  # the same, in this process


def model_digest_dir(workdir: Path) -> Path:
    """Where a run keeps its :data:`DIGEST_CACHE`: ``run`` makes the folder; ``plan`` makes none, and
    updates the cache only where the folder is there."""
    return workdir / "cache"


def model_digest(model_dir: Path, cache_dir: Path | None = None) -> str:
    """sha256 over a model directory's files (relative name and content): the identity of its weights,
    in the dataset key and the OpenVINO export's. Every byte counts: a checkpoint replaced in place by
    another of the same size is another model.

    Hashing 8 GB takes seconds, so each file's sha256 is kept in ``cache_dir`` (``DIGEST_CACHE``) by its
    size, inode and ctime (which every write changes, and no copy or ``touch`` can set back): read when
    there, written when ``cache_dir`` exists (``plan`` makes no folder)."""
    root = Path(model_dir)
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix.lower() not in DOC_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    cache_file = cache_dir / DIGEST_CACHE if cache_dir is not None else None
    known: dict[str, dict] = {}
    if cache_file is not None:
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(cache_file.read_text())
            known = loaded if isinstance(loaded, dict) else {}
    digest, changed = hashlib.sha256(), False
    for path in files:
        stat = path.stat()
        state = [stat.st_size, stat.st_ino, stat.st_ctime_ns]
        name = str(path.resolve())
        entry = known.get(name)
        sha = entry.get("sha256") if isinstance(entry, dict) and entry.get("state") == state else None
        if not (isinstance(sha, str) and len(sha) == 64):  # not recorded for this state, or not a digest
            sha = _HASHED.get((name, *state)) or sha256_file(path)
            known[name], changed = {"state": state, "sha256": sha}, True
        _HASHED[(name, *state)] = sha
        digest.update(str(path.relative_to(root)).encode() + b"\0" + sha.encode())
    if changed and cache_file is not None and cache_file.parent.is_dir():
        with contextlib.suppress(OSError):  # a cache: a read-only workdir only costs the next plan time
            atomic_write_json(cache_file, known)
    return digest.hexdigest()


@cache
def tokenizer_fingerprint(model_dir: str) -> str:
    """sha256 over the tokenizer files of a model directory (name and bytes)."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(model_dir) / name
        if path.exists():
            digest.update(name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@cache
def load_tokenizer(model_dir: str):  # -> transformers.PreTrainedTokenizerBase
    """The tokenizer of a local model directory (cached per process)."""
    offline_environment()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def end_token_problem(tokenizer) -> str | None:  # tokenizer: transformers.PreTrainedTokenizerBase
    """Why last-token pooling cannot use this tokenizer's texts (None: it can).

    Last-token pooling reads the state of a text's final token, which the model was trained to end with a
    special token the tokenizer itself appends (Qwen3-Embedding's post-processor appends <|endoftext|>,
    not its ``eos_token`` <|im_end|>). A tokenizer that appends nothing would pool a word piece; the right
    token is not guessed.
    """
    encoded = tokenizer("a", return_special_tokens_mask=True)  # the mask knows the post-processor's tokens
    ids, special = encoded["input_ids"], encoded["special_tokens_mask"]
    if ids and special[-1] == 1:
        return None
    return (
        "its tokenizer appends no end token to a text (tokenizer('a') gives ids "
        f"{ids}), and last-token pooling needs the special token the model ends texts with; use the "
        "model's own tokenizer files (a tokenizer.json whose post-processor appends it), or mean pooling"
    )


def pools_last_token(backend: str, pooling: str, model_dir: Path) -> bool:
    """Whether the vectors are the final token's state: the transformers recipe's ``pooling``, or for a
    sentence-transformers model its own Pooling module (``pooling_mode`` since sentence-transformers 6,
    ``pooling_mode_lasttoken`` before)."""
    import json

    if backend == "transformers":
        return pooling == "last_token"
    for path in model_dir.glob("*_Pooling/config.json"):
        settings = json.loads(path.read_text())
        if "lasttoken" in str(settings.get("pooling_mode")) or settings.get("pooling_mode_lasttoken"):
            return True
    return False


def max_input_tokens(model_dir: Path) -> tuple[int, str] | None:
    """The most tokens the model accepts, and which file says so, read from its config files (no weights).

    The smaller of config.json ``max_position_embeddings`` (the position table: beyond it the forward pass
    fails) and tokenizer_config.json ``model_max_length`` (which knows the offset RoBERTa-style models
    reserve); None when neither file states a limit.
    """
    import json

    limits: list[tuple[int, str]] = []
    for name, key in (
        ("config.json", "max_position_embeddings"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        try:
            value = json.loads((model_dir / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        # transformers writes a huge sentinel (1e30) for "no limit"
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 10**7:
            limits.append((value, f"{name} {key}"))
    return min(limits) if limits else None
