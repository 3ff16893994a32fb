"""UNITER's released checkpoint format: the state dict of the reference's ``UniterForPretraining``.

The released files (``uniter-base.pt``, ``uniter-large.pt``) are plain state dicts with the
reference's names (ChenRocks/UNITER ``model/model.py``, ``model/pretrain.py``): the encoder under
``uniter.`` (BERT's names plus ``img_embeddings.{img_linear, img_layer_norm, pos_linear,
pos_layer_norm, mask_embedding, LayerNorm}``), and the heads under ``cls.`` (MLM),
``feat_regress.`` (MRFR), ``region_classifier.`` (MRC) and ``itm_output.`` (ITM). UNITER-base has
230 keys. This module maps them to and from this project's ``UniterForPretraining`` names:

- Q, K and V: the reference's three ``attention.self.{query,key,value}`` are our fused ``qkv``
  (concatenated in that order).
- ``mask_embedding``: the reference's ``Embedding(2, D, padding_idx=0)`` is [2, D] with row 0
  always zero; ours keeps row 1 only ([1, D]).
- Tied copies: ``cls.predictions.decoder.weight`` is the word embedding and
  ``feat_regress.weight`` the image projection (the same tensors in the reference); we own neither,
  so an import checks them equal to what they are tied to and an export writes them back.

Pure: no file I/O (``pipeline.training.uniter_ckpt`` reads and writes the files).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from model.config import PRESETS
from model.weights_file import UniterFormatError

__all__ = [
    "HEADS",
    "ImportReport",
    "ReleaseShape",
    "UniterFormatError",
    "from_uniter",
    "load_uniter_state",
    "release_shape",
    "to_uniter",
]

# our head (UniterForPretraining attribute) -> the reference's key prefix
HEADS = {"mlm": "cls.", "mrfr": "feat_regress.", "mrc": "region_classifier.", "itm": "itm_output."}
# the reference's tied copies -> the reference key they are the same tensor as
TIED = {"cls.predictions.decoder.weight": "uniter.embeddings.word_embeddings.weight",
        "feat_regress.weight": "uniter.img_embeddings.img_linear.weight"}
MASK_KEY_OURS, MASK_KEY_REF = "uniter.img_embeddings.mask_embedding", "uniter.img_embeddings.mask_embedding.weight"

# inside encoder layer N: our module -> the reference's
_LAYER = {"attention.proj": "attention.output.dense", "attention_norm": "attention.output.LayerNorm",
          "ffn_in": "intermediate.dense", "ffn_out": "output.dense", "ffn_norm": "output.LayerNorm"}
# every other module (weight and bias) and parameter: ours -> the reference's
_MODULES = {
    "uniter.embeddings.word_embeddings": "uniter.embeddings.word_embeddings",
    "uniter.embeddings.position_embeddings": "uniter.embeddings.position_embeddings",
    "uniter.embeddings.token_type_embeddings": "uniter.embeddings.token_type_embeddings",
    "uniter.embeddings.norm": "uniter.embeddings.LayerNorm",
    "uniter.img_embeddings.feat_proj": "uniter.img_embeddings.img_linear",
    "uniter.img_embeddings.feat_norm": "uniter.img_embeddings.img_layer_norm",
    "uniter.img_embeddings.pos_proj": "uniter.img_embeddings.pos_linear",
    "uniter.img_embeddings.pos_norm": "uniter.img_embeddings.pos_layer_norm",
    "uniter.img_embeddings.norm": "uniter.img_embeddings.LayerNorm",
    "uniter.pooler.dense": "uniter.pooler.dense",
    "mlm.transform.dense": "cls.predictions.transform.dense",
    "mlm.transform.norm": "cls.predictions.transform.LayerNorm",
    "mrfr.transform.dense": "feat_regress.net.0",
    "mrfr.transform.norm": "feat_regress.net.2",
    "mrc.transform.dense": "region_classifier.net.0",
    "mrc.transform.norm": "region_classifier.net.2",
    "mrc.classifier": "region_classifier.net.3",
    "itm.classifier": "itm_output",
}
_PARAMS = {"mlm.bias": "cls.predictions.bias", "mrfr.bias": "feat_regress.bias"}
_OURS_LAYER = re.compile(r"^uniter\.encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_REF_LAYER = re.compile(r"^uniter\.encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")
_QKV = ("query", "key", "value")


def _ref_name(ours: str) -> str | None:
    """Our key -> the reference's (None for the fused qkv and the mask embedding, handled apart)."""
    if ours in _PARAMS:
        return _PARAMS[ours]
    m = _OURS_LAYER.match(ours)
    if m:
        layer, module, param = m.groups()
        return f"uniter.encoder.layer.{layer}.{_LAYER[module]}.{param}" if module in _LAYER else None
    module, _, param = ours.rpartition(".")
    return f"{_MODULES[module]}.{param}" if module in _MODULES else None


_REVERSE = {ref: ours for ours, ref in _MODULES.items()}
_REVERSE_LAYER = {ref: ours for ours, ref in _LAYER.items()}
_REVERSE_PARAMS = {ref: ours for ours, ref in _PARAMS.items()}


def _our_name(ref: str) -> str | None:
    """The reference's key -> ours (None when it has no counterpart; Q/K/V and the mask apart)."""
    if ref in _REVERSE_PARAMS:
        return _REVERSE_PARAMS[ref]
    m = _REF_LAYER.match(ref)
    if m:
        layer, module, param = m.groups()
        return f"uniter.encoder.layers.{layer}.{_REVERSE_LAYER[module]}.{param}" if module in _REVERSE_LAYER else None
    module, _, param = ref.rpartition(".")
    return f"{_REVERSE[module]}.{param}" if module in _REVERSE and param in ("weight", "bias") else None


def to_uniter(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our ``UniterForPretraining`` state dict -> the reference's (same tensors, dtypes kept).

    Raises UniterFormatError naming every key of ``state`` the format has no place for.
    """
    out: dict[str, torch.Tensor] = {}
    unplaced = []
    for key, value in state.items():
        m = _OURS_LAYER.match(key)
        if m and m.group(2) == "attention.qkv":
            layer, param = m.group(1), m.group(3)
            for part, chunk in zip(_QKV, value.chunk(3, dim=0)):
                out[f"uniter.encoder.layer.{layer}.attention.self.{part}.{param}"] = chunk.clone()
        elif key == MASK_KEY_OURS:
            out[MASK_KEY_REF] = torch.cat([torch.zeros_like(value), value])
        elif (ref := _ref_name(key)) is not None:
            out[ref] = value
        else:
            unplaced.append(key)
    if unplaced:
        raise UniterFormatError(f"the UNITER format has no place for {unplaced}")
    for copy, source in TIED.items():
        head = copy.split(".", 1)[0] + "."
        if source in out and any(k.startswith(head) for k in out):  # only with the head it belongs to
            out[copy] = out[source]
    return out


def from_uniter(ref: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The reference's state dict -> (ours, problems): Q/K/V fused, the mask embedding's row 1,
    tied copies checked and dropped. ``problems`` names every key with no counterpart, every
    incomplete Q/K/V triple and every tied copy that differs from its source."""
    out: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key, value in ref.items():
        m = _REF_LAYER.match(key)
        if m and m.group(2).startswith("attention.self."):
            part = m.group(2).rsplit(".", 1)[1]
            if part in _QKV:
                qkv.setdefault((m.group(1), m.group(3)), {})[part] = value
                continue
        if key in TIED:
            source = ref.get(TIED[key])
            if source is None or source.shape != value.shape or not torch.equal(source, value):
                problems.append(f"{key}: differs from {TIED[key]}, which the reference ties it to")
            continue
        if key == MASK_KEY_REF:
            if value.ndim != 2 or value.shape[0] != 2:
                problems.append(f"{key}: shape {tuple(value.shape)}, expected [2, img_dim]")
            else:
                out[MASK_KEY_OURS] = value[1:].clone()
            continue
        ours = _our_name(key)
        if ours is None:
            problems.append(f"{key}: unexpected (no such parameter in UNITER's UniterForPretraining)")
        else:
            out[ours] = value
    for (layer, param), parts in sorted(qkv.items()):
        if set(parts) != set(_QKV):
            missing = sorted(set(_QKV) - set(parts))
            problems.append(f"uniter.encoder.layer.{layer}.attention.self.{{{','.join(missing)}}}.{param}: missing")
            continue
        shapes = {p: tuple(t.shape) for p, t in parts.items()}
        if len(set(shapes.values())) != 1:
            problems.append(f"uniter.encoder.layer.{layer}.attention.self.*.{param}: shapes differ {shapes}")
            continue
        out[f"uniter.encoder.layers.{layer}.attention.qkv.{param}"] = torch.cat([parts[p] for p in _QKV])
    return out, problems


@dataclass(frozen=True)
class ReleaseShape:
    """What a release file's shapes say: encoder width and depth, vocabulary, image feature size."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    img_dim: int
    num_classes: int | None  # MRC's classes (None: no region_classifier)
    heads: tuple[str, ...]  # our names of the heads the file has

    @property
    def preset(self) -> str | None:
        """The preset of this shape (``base`` 768x12, ``large`` 1024x24, ...), None when none fits."""
        for name, cfg in PRESETS.items():
            if (cfg.hidden_size, cfg.num_layers, cfg.intermediate_size) == (
                    self.hidden_size, self.num_layers, self.intermediate_size):
                return name
        return None

    def describe(self) -> str:
        return (f"{self.preset or 'no preset'} ({self.hidden_size} x {self.num_layers} layers, FFN "
                f"{self.intermediate_size}), vocabulary {self.vocab_size}, img_dim {self.img_dim}")


def release_shape(ref: Mapping[str, torch.Tensor]) -> ReleaseShape:
    """The shape of a reference-named state dict; UniterFormatError when its encoder keys are absent."""
    need = ["uniter.embeddings.word_embeddings.weight", "uniter.embeddings.position_embeddings.weight",
            "uniter.embeddings.token_type_embeddings.weight", "uniter.img_embeddings.img_linear.weight",
            "uniter.encoder.layer.0.intermediate.dense.weight"]
    missing = [k for k in need if k not in ref]
    if missing:
        raise UniterFormatError(f"not a UNITER checkpoint: it lacks {missing} (first keys: {list(ref)[:5]})")
    layers = {int(m.group(1)) for k in ref if (m := _REF_LAYER.match(k))}
    classifier = ref.get("region_classifier.net.3.weight")
    heads = tuple(h for h, prefix in HEADS.items() if any(k.startswith(prefix) for k in ref))
    return ReleaseShape(
        hidden_size=int(ref["uniter.embeddings.word_embeddings.weight"].shape[1]),
        num_layers=max(layers) + 1,
        intermediate_size=int(ref["uniter.encoder.layer.0.intermediate.dense.weight"].shape[0]),
        vocab_size=int(ref["uniter.embeddings.word_embeddings.weight"].shape[0]),
        max_position_embeddings=int(ref["uniter.embeddings.position_embeddings.weight"].shape[0]),
        type_vocab_size=int(ref["uniter.embeddings.token_type_embeddings.weight"].shape[0]),
        img_dim=int(ref["uniter.img_embeddings.img_linear.weight"].shape[1]),
        num_classes=None if classifier is None else int(classifier.shape[0]), heads=heads)


@dataclass
class ImportReport:
    """What :func:`load_uniter_state` did: heads loaded, heads skipped (and why), tensors copied."""

    loaded_heads: list[str] = field(default_factory=list)
    skipped_heads: dict[str, str] = field(default_factory=dict)  # head -> why it keeps its fresh start
    tensors: int = 0

    def to_json(self) -> dict:
        return {"loaded_heads": self.loaded_heads, "skipped_heads": self.skipped_heads, "tensors": self.tensors}


def load_uniter_state(model: nn.Module, ref: Mapping[str, torch.Tensor], *, needs: tuple[str, ...] | set[str],
                      source: str) -> ImportReport:
    """Copy a reference-named state dict into ``model`` (our ``UniterForPretraining``), strictly.

    Every encoder parameter and every head in ``needs`` must be present with the model's shape;
    a head not needed that the file lacks, or has in another shape (MRC over other detector
    classes), keeps its fresh start and is reported as skipped. Floating tensors are copied as
    the model's dtype (fp16 files load into fp32). Nothing is copied unless everything fits.

    Raises:
        UniterFormatError: naming ``source`` and every missing, unexpected or mis-shaped key.
    """
    ours, problems = from_uniter(ref)
    own = model.state_dict()
    present_heads = {h for h in HEADS if any(k.startswith(f"{h}.") for k in ours)}
    report = ImportReport()
    wanted: dict[str, torch.Tensor] = {}
    for head in HEADS:
        keys = [k for k in own if k.startswith(f"{head}.")]
        if not keys:
            continue
        if head not in present_heads:
            if head in needs:
                problems.append(f"head {head} ({HEADS[head]}*): missing, and this run needs it")
            else:
                report.skipped_heads[head] = "not in the file"
            continue
        misfit = [f"{k} {tuple(ours[k].shape)} vs {tuple(own[k].shape)}" for k in keys
                  if k in ours and ours[k].shape != own[k].shape]
        absent = [k for k in keys if k not in ours]
        if (misfit or absent) and head not in needs:
            report.skipped_heads[head] = f"shapes differ from this model's: {misfit + absent}"
            for k in keys:
                ours.pop(k, None)
            continue
        report.loaded_heads.append(head)
    for key, value in ours.items():
        if key not in own:
            problems.append(f"{_ref_name(key) or key}: unexpected (this model has no {key})")
        elif value.shape != own[key].shape:
            problems.append(f"{_ref_name(key) or key}: shape {tuple(value.shape)}, "
                            f"the model expects {tuple(own[key].shape)}")
        else:
            wanted[key] = value
    skipped = {k for k in own if k.split(".", 1)[0] in report.skipped_heads}
    missing = sorted(set(own) - set(ours) - skipped)
    problems += [f"{_ref_name(k) or k}: missing" for k in missing]
    if problems:
        raise UniterFormatError(f"{source}: does not fit the model ({len(problems)} problem(s)): "
                                + "; ".join(problems))
    with torch.no_grad():
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        for key, value in wanted.items():
            target = params.get(key, buffers.get(key))
            target.copy_(value.to(target.dtype))
    report.tensors = len(wanted)
    return report
