"""UniterForPretraining: the encoder with its five pretraining objectives (docs/design.md §10).

One task per mini-batch (UNITER draws one per optimizer step by ``mix_ratio``): ``forward(batch,
task)`` runs the encoder once and computes only that task's loss. ITM batches also get WRA when the model was
built with ``wra_weight > 0``: loss = itm_loss + wra_weight * wra_loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from model.config import UniterConfig
from model.heads import ItmHead, ItmOutput, MlmHead, MlmOutput, MrcHead, MrcOutput, MrfrHead, MrfrOutput
from model.heads.wra import WRA_WORDS, WraOutput, word_region_alignment
from model.layers import init_bert_weights
from model.uniter import UniterModel

__all__ = ["PRETRAIN_TASKS", "PretrainOutput", "UniterForPretraining"]

PRETRAIN_TASKS = ("mlm", "mrfr", "mrc", "mrc_kl", "itm")


@dataclass
class PretrainOutput:
    """loss: scalar to backpropagate; metrics: python floats for logging (one device sync);
    head: the task head's typed output; wra: WRA's output on ITM batches when enabled."""

    loss: torch.Tensor
    metrics: dict[str, float]
    head: MlmOutput | MrfrOutput | MrcOutput | ItmOutput
    wra: WraOutput | None = None


class UniterForPretraining(nn.Module):
    """UNITER encoder + MLM, MRFR, MRC (shared by mrc and mrc_kl), ITM heads and WRA.

    Args:
        config: encoder shape.
        img_dim: region feature size D (image DB ``meta.json`` ``feature_dim``).
        num_classes: detector classes including background (C+1, ``meta.json`` ``num_classes``).
        wra_weight: weight of WRA in ITM batches; 0 disables WRA (UNITER: 0.1).
        ot_beta, ot_iterations, ot_inner_steps: IPOT settings (UNITER: 0.5, 50, 1).
        mrc_kl_reduction: ``mean`` over all N x (C+1) KL terms (UNITER) or ``region_sum``
            (model/heads/mrm.py ``MrcHead``).
        wra_words: ``all`` real text positions, [CLS] and [SEP] included (UNITER), or ``content``
            (model/heads/wra.py ``word_positions``).
        itm_init_std: std of the ITM classifier's normal start; None: ``config.initializer_range``
            (UNITER: 0.02, as every new layer). Scales the same random draw, so every other
            parameter's start is the same whatever its value.
    """

    def __init__(
        self,
        config: UniterConfig,
        *,
        img_dim: int,
        num_classes: int,
        wra_weight: float = 0.0,
        ot_beta: float = 0.5,
        ot_iterations: int = 50,
        ot_inner_steps: int = 1,
        mrc_kl_reduction: str = "mean",
        wra_words: str = "all",
        itm_init_std: float | None = None,
    ):
        super().__init__()
        if wra_weight < 0:
            raise ValueError(f"wra_weight must be >= 0, got {wra_weight}")
        self.config = config
        self.uniter = UniterModel(config, img_dim=img_dim)
        eps = config.layer_norm_eps
        self.mlm = MlmHead(config.hidden_size, config.vocab_size, eps=eps)
        self.mrfr = MrfrHead(config.hidden_size, img_dim, eps=eps)
        self.mrc = MrcHead(config.hidden_size, num_classes, eps=eps, kl_reduction=mrc_kl_reduction)
        self.itm = ItmHead(config.hidden_size)
        if itm_init_std is not None and not itm_init_std > 0:
            raise ValueError(f"itm_init_std must be > 0, got {itm_init_std}")
        itm_std = config.initializer_range if itm_init_std is None else itm_init_std
        for head, std in ((self.mlm, config.initializer_range), (self.mrfr, config.initializer_range),
                          (self.mrc, config.initializer_range), (self.itm, itm_std)):
            head.apply(lambda m, std=std: init_bert_weights(m, std))
        self.wra_weight = wra_weight
        if wra_words not in WRA_WORDS:
            raise ValueError(f"wra_words must be one of {WRA_WORDS}, got {wra_words!r}")
        self.ot_settings = {"beta": ot_beta, "iterations": ot_iterations, "inner_steps": ot_inner_steps,
                            "words": wra_words}

    def forward(
        self, batch: Mapping[str, torch.Tensor], task: str | None = None, *, return_plan: bool = False
    ) -> PretrainOutput:
        """Loss and metrics of one pretraining ``task`` on ``batch`` (docs/design.md §10 keys).

        task: mlm | mrfr | mrc | mrc_kl | itm (None: ``batch["task"]``). MLM needs ``txt_labels``;
        MRM tasks need ``img_masked`` plus ``img_feat_target`` (mrfr) or ``img_soft_labels``
        (mrc, mrc_kl); ITM needs ``itm_targets``. ``return_plan`` keeps WRA's transport plan.
        """
        task = task if task is not None else batch.get("task")
        if task not in PRETRAIN_TASKS:
            raise ValueError(f"unknown pretraining task {task!r}; expected one of {PRETRAIN_TASKS}")
        self._require(batch, task)
        img_masked = batch.get("img_masked")
        sequence = self.uniter(
            batch["input_ids"],
            batch["txt_mask"],
            batch["img_feat"],
            batch["img_pos"],
            batch["img_mask"],
            img_masked,
            txt_type_ids=batch.get("txt_type_ids"),
            img_type_ids=batch.get("img_type_ids"),
        )
        lt = batch["input_ids"].shape[1]
        text_out, region_out = sequence[:, :lt], sequence[:, lt:]
        if task == "mlm":
            out = self.mlm(text_out, batch["txt_labels"], self.uniter.embeddings.word_embeddings.weight)
            return self._finish(
                out.loss, out, {"mlm_loss": out.loss, "mlm_acc": out.accuracy}, "n_tokens", out.n_tokens
            )
        if task == "mrfr":
            proj = self.uniter.img_embeddings.feat_proj.weight
            out = self.mrfr(region_out, img_masked, batch["img_feat_target"], proj)
            return self._finish(out.loss, out, {"mrfr_loss": out.loss}, "n_regions", out.n_regions)
        if task in ("mrc", "mrc_kl"):
            out = self.mrc(region_out, img_masked, batch["img_soft_labels"], kl=task == "mrc_kl")
            return self._finish(
                out.loss, out, {f"{task}_loss": out.loss, "mrc_acc": out.accuracy}, "n_regions", out.n_regions
            )
        return self._itm(batch, sequence, text_out, region_out, return_plan)

    def _itm(self, batch, sequence, text_out, region_out, return_plan) -> PretrainOutput:
        targets = batch["itm_targets"]
        out = self.itm(self.uniter.pool(sequence), targets)
        metrics = {"itm_loss": out.loss, "itm_acc": out.accuracy}
        if self.wra_weight <= 0:
            return self._finish(out.loss, out, metrics, "n_pairs", out.n_pairs)
        wra = word_region_alignment(
            text_out, region_out, batch["txt_mask"], batch["img_mask"], targets,
            return_plan=return_plan, **self.ot_settings,
        )  # fmt: skip
        loss = out.loss + self.wra_weight * wra.loss
        metrics.update(wra_loss=wra.loss, ot_dist=wra.distances.mean(), ot_pos=wra.mean_pos, ot_neg=wra.mean_neg)
        result = self._finish(loss, out, metrics, "n_pairs", out.n_pairs, wra)
        # ot_pos / ot_neg are means over the matched / swapped pairs only (nan when a batch has none):
        # their counts let a running mean weight them by those pairs
        n_pos = int(targets.sum())
        result.metrics.update(n_pos=float(n_pos), n_neg=float(out.n_pairs - n_pos))
        return result

    @staticmethod
    def _finish(loss, head, tensors: dict, count_name: str, count: int, wra: WraOutput | None = None) -> PretrainOutput:
        names = ["loss", *tensors]
        values = torch.stack([loss.detach().float(), *(t.detach().float() for t in tensors.values())]).tolist()
        metrics = dict(zip(names, values))
        metrics[count_name] = float(count)
        return PretrainOutput(loss=loss, metrics=metrics, head=head, wra=wra)

    @staticmethod
    def _require(batch: Mapping[str, torch.Tensor], task: str) -> None:
        needed = ["input_ids", "txt_mask", "img_feat", "img_pos", "img_mask"]
        needed += {
            "mlm": ["txt_labels"],
            "mrfr": ["img_masked", "img_feat_target"],
            "mrc": ["img_masked", "img_soft_labels"],
            "mrc_kl": ["img_masked", "img_soft_labels"],
            "itm": ["itm_targets"],
        }[task]
        missing = [k for k in needed if batch.get(k) is None]
        if missing:
            raise KeyError(f"{task} batch lacks key(s) {missing}; it has {sorted(batch)}")
