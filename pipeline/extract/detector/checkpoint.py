"""Detector checkpoints: the caffe-converted bottom-up-attention file and our own mini detector.

The bottom-up-attention weights converted from caffe to detectron2 ship as a pickle (``.pkl``):
``{"model": {name: numpy array}, "__author__": str}`` with detectron2 parameter names
(``backbone.stem.conv1.weight``, ``backbone.res4.22.conv3.norm.running_var``,
``proposal_generator.rpn_head.conv.weight``, ``roi_heads.res5.2.conv3.weight``,
``roi_heads.box_predictor.{cls_score, bbox_pred, cls_embedding, fc_attr, attr_score}.*``), frozen
BatchNorm as ``norm.{weight, bias, running_mean, running_var}``. The pickle is read with a
restricted unpickler that can only build plain containers and numpy arrays, never run code.
The mini detector is saved by ``train_detector`` as a torch file ``{"model": state_dict,
"meta": {...}}``. Loading is strict: every parameter and buffer of the model must be present
with the right shape, and nothing else may be in the file.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from model.weights_file import load_plain_torch

# (module, name) pairs a weights pickle may reference: numpy array reconstruction only (protocol 2
# pickles spell raw bytes as _codecs.encode(str, "latin1")).
_SAFE_GLOBALS = {
    ("_codecs", "encode"),
    ("collections", "OrderedDict"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
}


class CheckpointError(ValueError):
    """A checkpoint file does not match the model it is loaded into."""


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _SAFE_GLOBALS:
            raise pickle.UnpicklingError(f"weights pickle references {module}.{name}, which is not allowed")
        return super().find_class(module, name)


def _read_pickle(path: Path) -> Any:
    with path.open("rb") as fh:
        # latin1: the published conversion was pickled by python 2 with numpy arrays
        return _ArrayUnpickler(fh, encoding="latin1").load()


def read_state(path: Path | str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a checkpoint file into (state dict of tensors, meta).

    ``.pkl``: the caffe-converted layout (``meta`` holds ``__author__`` if present).
    Anything else: a torch file holding ``{"model": state_dict, "meta": {...}}`` or a bare state
    dict, loaded with tensors and plain containers only: a file holding other pickled objects
    raises :class:`~model.weights_file.UnsafeCheckpointError` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"detector weights not found: {path}")
    if path.suffix == ".pkl":
        try:
            obj = _read_pickle(path)
        except (pickle.UnpicklingError, EOFError, ValueError) as err:
            raise CheckpointError(f"{path}: not a caffe-converted detectron2 pickle ({err})") from None
    else:
        obj = load_plain_torch(path)
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path}: expected a mapping at the top level, got {type(obj).__name__}")
    raw = obj.get("model", obj)
    meta = dict(obj.get("meta", {}))
    if "__author__" in obj:
        meta["__author__"] = obj["__author__"]
    state: dict[str, torch.Tensor] = {}
    for name, value in raw.items():
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.ascontiguousarray(value))
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{path}: entry {name!r} is a {type(value).__name__}, expected an array")
        state[str(name)] = value
    return state, meta


def load_weights(model: nn.Module, path: Path | str) -> dict[str, Any]:
    """Load ``path`` into ``model`` strictly; return the checkpoint's meta.

    Raises CheckpointError naming the missing / unexpected / mis-shaped entries (first 10 each).
    BatchNorm's ``num_batches_tracked`` counters may be absent (caffe has none).
    """
    state, meta = read_state(path)
    expected = model.state_dict()
    missing = sorted(k for k in expected if k not in state and not k.endswith("num_batches_tracked"))
    unexpected = sorted(k for k in state if k not in expected)
    shapes = sorted(f"{k}: file {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
                    for k, v in state.items() if k in expected and v.shape != expected[k].shape)
    problems = []
    for what, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", shapes)):
        if items:
            problems.append(f"{len(items)} {what}: " + ", ".join(items[:10]) + (" ..." if len(items) > 10 else ""))
    if problems:
        raise CheckpointError(f"{path} does not fit the {type(model).__name__}: " + "; ".join(problems))
    converted = {k: v.to(expected[k].dtype) for k, v in state.items()}
    model.load_state_dict(converted, strict=False)
    return meta


def save_caffe_layout(model: nn.Module, path: Path | str, *, author: str) -> None:
    """Write ``model`` in the caffe-converted pickle layout (numpy float32 arrays by name).

    Used by tests (a randomly initialized R101 round trip) and to convert our own checkpoints.
    ``num_batches_tracked`` counters are left out, as in the published file.
    """
    arrays = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()
              if not k.endswith("num_batches_tracked")}
    buf = io.BytesIO()
    pickle.dump({"model": arrays, "__author__": author}, buf, protocol=2)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(buf.getvalue())


def vocab_names(weights: Path | str | None, file_name: str, count: int, prefix: str) -> list[str]:
    """Class or attribute names from a vocabulary file next to the weights (one name per line,
    e.g. ``objects_vocab.txt`` of bottom-up-attention), else ``prefix_0000`` placeholders."""
    if weights is not None:
        vocab = Path(weights).with_name(file_name)
        if vocab.is_file():
            names = [line.strip() for line in vocab.read_text(encoding="utf-8").splitlines() if line.strip()]
            if len(names) != count:
                raise CheckpointError(f"{vocab}: expected {count} names, found {len(names)}")
            return names
    return [f"{prefix}_{i:04d}" for i in range(count)]
