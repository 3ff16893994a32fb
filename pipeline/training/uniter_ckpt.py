"""UNITER release files on disk: read one safely, check it against the run, write one.

A release file (``uniter-base.pt``, ``uniter-large.pt``) is a plain torch state dict with the
reference's names (:mod:`model.uniter_format`); a ``.safetensors`` file with those names is read too.
A torch file is read with ``torch.load(weights_only=True)``
(:func:`model.weights_file.load_plain_torch`): tensors and plain containers only, a pickled payload
is refused naming the file. Floating tensors are returned in fp32 whatever the file holds (the
release is fp16 or fp32).

An export (:func:`write_release`) writes three files: ``<name>.pt`` (the state dict, as
``UniterForPretraining.state_dict()`` of the reference has it), ``<name>.config.json`` (the
reference's ``--model_config``: BERT's config fields) and ``<name>.export.json`` (this project's
notes: what the model was, its digest, and where it departs from what the format can say;
docs/real-data.md). An import reads ``<name>.export.json`` when it is there, to check that the run
computes as the exported model did.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from model.config import UniterConfig
from model.uniter_format import ReleaseShape, UniterFormatError, release_shape, to_uniter
from model.weights_file import load_plain_torch
from pipeline.common.runinfo import atomic_write_json, file_digest

__all__ = ["FORWARD_KEYS", "REFERENCE_FORWARD", "Release", "export_notes", "notes_path", "read_release",
           "reference_config", "write_release"]

# the model params that change what the encoder computes from the same weights, and UNITER's values
FORWARD_KEYS = ("region_feature_norm", "region_box_norm")
REFERENCE_FORWARD = {"region_feature_norm": "none", "region_box_norm": "none"}
REFERENCE_IMG_DIM, REFERENCE_CLASSES = 2048, 1601  # the reference's IMG_DIM and IMG_LABEL_DIM constants
REFERENCE_VOCAB = 28996  # bert-base-cased, UNITER's tokenizer


@dataclasses.dataclass(frozen=True)
class Release:
    """A release file read into memory: fp32 tensors with the reference's names."""

    path: Path
    sha256: str
    state: dict[str, torch.Tensor]
    shape: ReleaseShape
    dtypes: tuple[str, ...]  # the floating dtypes the file held (torch.float16, ...)
    notes: dict[str, Any] | None  # <name>.export.json when this project wrote the file

    def forward_settings(self) -> dict[str, str]:
        """What the model computed with: the export's notes, or UNITER's choices for the authors' file."""
        if self.notes is None:
            return dict(REFERENCE_FORWARD)
        return {k: self.notes["model"][k] for k in FORWARD_KEYS}


def notes_path(path: Path) -> Path:
    return path.with_name(path.stem + ".export.json")


def config_path(path: Path) -> Path:
    return path.with_name(path.stem + ".config.json")


def read_release(path: Path | str, *, sha256: str | None = None) -> Release:
    """Read and check a release file. ``sha256``: the digest params pin it to (checked first).

    Raises:
        UniterFormatError: the digest differs, or the file is not a state dict of tensors with
            the reference's encoder keys (names the file and what it holds).
        model.weights_file.UnsafeCheckpointError: the file holds pickled objects beyond tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise UniterFormatError(f"{path}: no such file")
    digest = file_digest(path)
    if sha256 is not None and digest != sha256.lower():
        raise UniterFormatError(f"{path}: sha256 {digest}, but model.uniter_checkpoint_sha256 pins {sha256}: the "
                                "file changed since it was pinned; set the new digest if the change is meant")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        raw = load_file(str(path))
    else:
        try:
            raw = load_plain_torch(path)
        except (KeyError, RuntimeError, EOFError, ValueError) as err:  # not a torch file at all
            raise UniterFormatError(f"{path}: not a torch state dict file ({type(err).__name__}: {err})") from None
    if not isinstance(raw, Mapping):
        raise UniterFormatError(f"{path}: not a state dict (it holds a {type(raw).__name__})")
    bad = [k for k, v in raw.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise UniterFormatError(f"{path}: not a state dict of tensors: {len(bad)} entr(ies) are not, e.g. "
                                f"{[str(k) for k in bad[:5]]} (a training checkpoint with optimizer state? "
                                "UNITER's release files are plain state dicts)")
    dtypes = tuple(sorted({str(v.dtype) for v in raw.values() if v.is_floating_point()}))
    state = {k: v.float() if v.is_floating_point() else v for k, v in raw.items()}
    try:
        shape = release_shape(state)
    except UniterFormatError as err:
        raise UniterFormatError(f"{path}: {err}") from None
    notes_file = notes_path(path)
    notes = json.loads(notes_file.read_text(encoding="utf-8")) if notes_file.is_file() else None
    if notes is not None and notes.get("sha256") != digest:
        notes = None  # notes of another file that once had this name: the file stands alone
    return Release(path=path, sha256=digest, state=state, shape=shape, dtypes=dtypes, notes=notes)


def reference_config(config: UniterConfig) -> dict[str, Any]:
    """The reference's ``--model_config`` (``config/uniter-base.json``'s fields) for ``config``."""
    return {"attention_probs_dropout_prob": config.attention_dropout, "hidden_act": "gelu",
            "hidden_dropout_prob": config.hidden_dropout, "hidden_size": config.hidden_size,
            "initializer_range": config.initializer_range, "intermediate_size": config.intermediate_size,
            "max_position_embeddings": config.max_position_embeddings, "num_attention_heads": config.num_heads,
            "num_hidden_layers": config.num_layers, "type_vocab_size": config.type_vocab_size,
            "vocab_size": config.vocab_size}


def export_notes(meta: Mapping[str, Any]) -> list[str]:
    """Where an exported model (its ``model_config.json``) departs from what the format says or
    the reference's scripts assume; empty for a model the reference computes exactly as we do."""
    cfg, notes = meta["uniter_config"], []
    for key in FORWARD_KEYS:
        if cfg.get(key, REFERENCE_FORWARD[key]) != REFERENCE_FORWARD[key]:
            notes.append(f"model.{key}={cfg[key]}: the reference has no such step ({REFERENCE_FORWARD[key]}), so its "
                         "code computes other outputs from these weights; this project does, with the same setting")
    if cfg["type_vocab_size"] != 2:
        notes.append(f"{cfg['type_vocab_size']} segment types (the reference's VCR models have 4; its "
                     "UniterForPretraining 2)")
    if meta["img_dim"] != REFERENCE_IMG_DIM or meta["num_classes"] != REFERENCE_CLASSES:
        notes.append(f"img_dim {meta['img_dim']} and {meta['num_classes']} detector classes: the reference's scripts "
                     f"hard-code IMG_DIM={REFERENCE_IMG_DIM} and IMG_LABEL_DIM={REFERENCE_CLASSES}")
    tokenizer = meta.get("tokenizer", {})
    if tokenizer.get("vocab_size") not in (None, REFERENCE_VOCAB) or cfg["vocab_size"] != REFERENCE_VOCAB:
        notes.append(f"vocabulary {cfg['vocab_size']} ({tokenizer.get('tokenizer', 'tokenizer not recorded')}): "
                     f"UNITER's text DBs use bert-base-cased ({REFERENCE_VOCAB} words)")
    return notes


def write_release(state: Mapping[str, torch.Tensor], meta: Mapping[str, Any], out: Path, *,
                  dtype: torch.dtype = torch.float32, source: str = "") -> dict[str, Any]:
    """Write ``out`` (our ``UniterForPretraining`` state dict in the reference's names), its
    ``.config.json`` and ``.export.json``; returns the notes written. Every file is written to a
    temporary name first, so a failed export leaves nothing half-written under those names."""
    ref = to_uniter(state)
    cast: dict[int, torch.Tensor] = {}  # one cast per storage: tied copies stay one tensor in the file
    out_state = {}
    for key, value in ref.items():
        if value.is_floating_point():
            value = cast.setdefault(id(value), value.detach().to("cpu", dtype).contiguous())
        out_state[key] = value
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    torch.save(out_state, tmp)
    os.replace(tmp, out)
    config = UniterConfig(**meta["uniter_config"])
    atomic_write_json(config_path(out), reference_config(config))
    notes = {"format": "uniter_release", "sha256": file_digest(out), "source": source,
             "keys": len(out_state), "dtype": str(dtype).removeprefix("torch."),
             "model": {k: meta["uniter_config"].get(k, REFERENCE_FORWARD[k]) for k in FORWARD_KEYS},
             "preset_shape": release_shape(out_state).describe(), "img_dim": meta["img_dim"],
             "num_classes": meta["num_classes"], "tokenizer": meta.get("tokenizer", {}),
             "departures": export_notes(meta)}
    atomic_write_json(notes_path(out), notes)
    return notes
