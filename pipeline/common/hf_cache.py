"""Hugging Face model ids for ``model.bert_checkpoint`` and ``build_dbs.tokenizer``.

A value that exists on disk is a path and stays one. Otherwise a value shaped like a hub id
(``bert-base-uncased``, ``google-bert/bert-base-uncased``) is looked up in the local Hugging Face
cache, as transformers' ``from_pretrained`` finds it: ``huggingface_hub.snapshot_download`` with
``local_files_only``, in ``$HF_HUB_CACHE`` (else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``).
A stage never downloads (DVC cannot track what the network gives); when the id is not cached the
error names the id, the cache folder it looked in and the command that fetches it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

# what a repo id looks like (huggingface_hub's validate_repo_id, without its length rule), and file
# suffixes that say a value is meant as a file, not an id
_REPO_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")
_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".txt", ".json", ".model")

BERT_FILES = ("model.safetensors", "pytorch_model.bin")  # model/bert_init.py reads either
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json")  # pipeline/stores/tokenization.py reads either
FILES = {"bert": BERT_FILES, "tokenizer": TOKENIZER_FILES}  # params fields name their list (params/checks.py)


class NotCached(FileNotFoundError):
    """A hub id that the local cache does not hold (the message says how to fetch it)."""


def hub_cache_dir() -> Path:
    """The cache folder the hub client uses now (its environment variables, read at call time)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def is_hub_id(value: str | Path) -> bool:
    """True for a value that is not an existing path and reads as a hub id (no file suffix, no
    leading ``.``/``/``/``~``, at most one ``/``)."""
    text = str(value)
    return (not Path(text).exists() and bool(_REPO_ID.match(text)) and not text.startswith((".", "~"))
            and not text.lower().endswith(_FILE_SUFFIXES) and ".." not in text)


def _fetch_hint(repo_id: str, files: Sequence[str]) -> str:
    extra = " config.json tokenizer_config.json"
    return (f"fetch it once with `HF_HUB_OFFLINE=0 hf download {repo_id} {' '.join(files)}{extra}` (the same "
            f"cache: HF_HUB_CACHE or HF_HOME), or give a local path instead")


def snapshot(repo_id: str, files: Sequence[str], *, key: str) -> Path:
    """The cached snapshot folder of ``repo_id`` holding one of ``files``; NotCached otherwise."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    where = cache / ("models--" + repo_id.replace("/", "--"))
    try:
        folder = Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        raise NotCached(f"{key}: {repo_id!r} is neither a path nor a Hugging Face id in the local cache "
                        f"(looked in {where}); {_fetch_hint(repo_id, files[:1])}") from None
    if not any((folder / name).is_file() for name in files):
        raise NotCached(f"{key}: the cached snapshot of {repo_id!r} ({folder}) has none of {list(files)}; "
                        f"{_fetch_hint(repo_id, files[:1])}")
    return folder


def resolve(value: str | Path | None, files: Sequence[str], *, key: str) -> Path | None:
    """``value`` as a local path: itself when it is not a hub id, else the first of ``files`` in
    its cached snapshot (None stays None: the caller's default)."""
    if value is None or not is_hub_id(value):
        return None if value is None else Path(value)
    folder = snapshot(str(value), files, key=key)
    return next(folder / name for name in files if (folder / name).is_file())


def resolve_bert_checkpoint(value: str | Path | None) -> Path | None:
    """``model.bert_checkpoint``: a path, or the weights file of a cached hub id."""
    return resolve(value, BERT_FILES, key="model.bert_checkpoint")
