"""What every fine-tuning task provides, and the module the DeepSpeed engine trains.

A task (one subclass of :class:`FinetuneTask` per module of this package; NLVR2 and SNLI-VE through
``pipeline.finetune.tasks.classification``) knows its text DBs, how an example becomes rows
(``pipeline.finetune.tasks.rows``), which ``model.tasks`` head it trains, and how it is evaluated.
The runner (``pipeline.finetune.runner``) does the rest the same way for all six.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

import torch
from torch import nn

from model.config import UniterConfig
from model.tasks import TaskOutput
from model.uniter import load_encoder_state
from pipeline.training.paired import group_key, item_scores
from pipeline.finetune.tasks.rows import Regions, TaskDataset, collate_rows
from pipeline.params.finetune import TASK_SPLITS, FinetuneConfig, TaskConfig, TaskSplits
from pipeline.stores.readers import ImageDbGroup, TextDb

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskContext:
    """Where a task reads from and what it was asked for (resolved from params)."""

    name: str
    data: Path  # params.paths.data
    cfg: FinetuneConfig
    task_cfg: TaskConfig
    seed: int
    # True: the task scores its dev split(s) only and never opens a test split (``pipeline budgets``:
    # a choice made on dev cannot see test, by construction)
    dev_only: bool = False

    @property
    def txt_root(self) -> Path:
        return self.data / "db" / "txt"

    @property
    def img_root(self) -> Path:
        return self.data / "db" / "img"


@dataclass
class EvalResult:
    """``metrics``: {split: {name: value}} (accuracies and recalls in percent); ``artifacts``: files
    to write beside the model ({file name: JSON-ready object}, e.g. VQA predictions); ``items``: the
    per-item scores of each headline metric on each scored split ({"split/metric":
    ``pipeline.training.paired.item_scores``}), from which the gain's interval is drawn."""

    metrics: dict[str, dict[str, Any]]
    artifacts: dict[str, Any]
    items: dict[str, dict[str, list]] = field(default_factory=dict)


class FinetuneTask:
    """Base of the six tasks. Subclasses set the class attributes and implement the hooks.

    Attributes:
        name: the task (``finetune@<name>``).
        init_stage: the pretraining export it starts from (``data/models/<init_stage>``).
        streams: training streams; with several, the steps alternate between them by a seeded
            schedule of equal ratios (VCR: Q→A and QA→R; retrieval: text→image and image→text).
        headline: ``(label, metric)`` pairs of the results table; the label's ``{split}`` names the
            split reported (:attr:`summary`).
        start_heads: pretraining heads (``UniterForPretraining`` attributes) the task starts a head
            from; the start's other heads are skipped (``_run.json`` ``start_heads``).

    Splits come from ``pipeline.params.finetune.TASK_SPLITS``: every task scores its dev split(s),
    where choices are made, and its test split(s), which are only reported. Several test splits
    (RefCOCO+ testA and testB) are also scored pooled, as ``"testA+testB"``.
    """

    name: str = ""
    init_stage: str = "pretrain"
    streams: tuple[str, ...] = ()
    headline: tuple[tuple[str, str], ...] = ()
    has_zero_shot: bool = False
    start_heads: tuple[str, ...] = ()

    def __init__(self, ctx: TaskContext) -> None:
        self.ctx = ctx
        self._txt: dict[str, TextDb] = {}
        self._img: ImageDbGroup | None = None
        self._labelled: dict[tuple[str, ...], list[str]] = {}

    # -- splits --------------------------------------------------------------------------------

    @property
    def splits(self) -> TaskSplits:
        splits = TASK_SPLITS[self.name]
        return replace(splits, test=()) if self.ctx.dev_only else splits

    @property
    def dev_split(self) -> str:
        """The split choices are made on, and the training-format held-out batches come from."""
        return pooled(self.splits.dev)

    @property
    def test_split(self) -> str:
        return pooled(self.splits.test)

    def test_labelled(self) -> bool:
        """Whether a test split is scored: the task has one here (not ``dev_only``) and its labels are here."""
        return bool(self.splits.test) and self.test_labels_here()

    def test_labels_here(self) -> bool:
        """Whether the test labels are here. Real VQA and VCR test labels live on an evaluation server:
        without the mini world's stand-in file the test split is predicted, never scored."""
        return True

    @property
    def reported_split(self) -> str:
        """The split of the results table: test, or dev where the test labels are not here."""
        return self.test_split if self.test_labelled() else self.dev_split

    @property
    def summary(self) -> tuple[tuple[str, str], ...]:
        """``(label, "split/metric")`` pairs that go into the results table and the Meta-Sum."""
        split = self.reported_split
        return tuple((label.format(split=split), f"{split}/{metric}") for label, metric in self.headline)

    # -- stores --------------------------------------------------------------------------------

    def db(self, name: str) -> TextDb:
        """The text DB ``data/db/txt/<name>`` (opened once); a missing DB names the stage to run."""
        if name not in self._txt:
            path = self.ctx.txt_root / name
            if not (path / "meta.json").exists():
                raise FileNotFoundError(f"{self.name}: text DB {path} not found (run the build_dbs stage first)")
            self._txt[name] = TextDb(path)
        return self._txt[name]

    def text_dbs(self) -> list[str]:
        """Every text DB the task reads (opened up front so a missing one fails early)."""
        raise NotImplementedError

    def labelled(self, name: str, *keys: str) -> list[str]:
        """Ids of DB ``name``'s examples whose ``keys`` (default ``label``) are all >= 0 (read once)."""
        keys = keys or ("label",)
        if (name, *keys) not in self._labelled:
            db = self.db(name)
            self._labelled[(name, *keys)] = [e for e in db.ids if all(int(db[e].get(k, -1)) >= 0 for k in keys)]
        return self._labelled[(name, *keys)]

    def open(self) -> None:
        dbs = [self.db(n) for n in self.text_dbs()]
        names = sorted({n for db in dbs for n in db.img_db_names} | set(self.extra_image_dbs()))
        missing = [n for n in names if not (self.ctx.img_root / n / "meta.json").exists()]
        if missing:
            raise FileNotFoundError(f"{self.name}: image DB(s) {missing} not found under {self.ctx.img_root}")
        self._img = ImageDbGroup(self.ctx.img_root, names)

    def extra_image_dbs(self) -> list[str]:
        """Image DBs needed beyond those the text DBs name (RefCOCO+: the ground-truth boxes)."""
        return []

    @property
    def img_dbs(self) -> ImageDbGroup:
        if self._img is None:
            self.open()
        assert self._img is not None
        return self._img

    @property
    def regions(self) -> Regions:
        return Regions(self.img_dbs)

    @property
    def special(self) -> dict[str, int]:
        return self.db(self.text_dbs()[0]).meta["special_ids"]

    def vocab_size(self) -> int:
        meta = self.db(self.text_dbs()[0]).meta
        return int(meta["vocab_size"]) + int(meta.get("obj_tags", {}).get("extra_vocab", 0))

    # -- hooks ---------------------------------------------------------------------------------

    def train_dataset(self, stream: str) -> TaskDataset:
        raise NotImplementedError

    def held_out_dataset(self, stream: str) -> TaskDataset:
        """Labelled examples of the dev split, in the training format (dvclive val curves)."""
        raise NotImplementedError

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Rows plus ``targets`` (the default: one int target per item)."""
        batch = collate_rows(items)
        batch["targets"] = torch.tensor([int(it["target"]) for it in items], dtype=torch.long)
        return batch

    def build_model(self, config: UniterConfig, *, img_dim: int) -> nn.Module:
        raise NotImplementedError

    def load_pretrained(self, model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
        """Fill the encoder from a ``UniterForPretraining`` state dict (heads keep their init)."""
        load_encoder_state(model, state)

    def train_forward(self, model: nn.Module, batch: dict[str, Any], stream: str) -> TaskOutput:
        return model(batch)

    def evaluate(self, model: nn.Module, device: torch.device, *, artifacts: bool = True) -> EvalResult:
        """Every metric of ``model`` (in eval mode); ``artifacts=False`` skips work done only for the
        files written beside the model (VQA: test-set predictions)."""
        raise NotImplementedError

    def chance(self) -> dict[str, float]:
        """Chance level of each headline metric on every scored split ({"split/metric": percent})."""
        raise NotImplementedError

    def dev_score(self, model: nn.Module, device: torch.device) -> tuple[float, float]:
        """(score, standard error) in points: the mean of the headline metrics on the dev split,
        scoring dev only (as a ``dev_only`` task: no test split is read; ``python -m pipeline
        budgets`` scores a point so), and the largest standard error a score from that many dev
        items can have, ``sqrt(sum_k 1 / (4 n_k)) / K`` over the K metrics (binomial at p = 1/2: a
        tiny split that happens to score 100% still has an error of its size)."""
        ctx = self.ctx
        self.ctx = replace(ctx, dev_only=True)
        try:
            result = self.evaluate(model, device, artifacts=False)
        finally:
            self.ctx = ctx
        variances = []
        for _, metric in self.headline:
            n = len(result.items.get(f"{self.dev_split}/{metric}", {}).get("scores") or [0.0])
            variances.append(0.25 / n)
        return self.dev_mean(result.metrics), 100 * math.sqrt(sum(variances)) / len(variances)

    def dev_mean(self, metrics: Mapping[str, Any]) -> float:
        """The mean of the headline metrics on dev of ``metrics`` ({split: {name: value}}, or the
        flat {"split/metric": value} of :meth:`chance`)."""
        names = [f"{self.dev_split}/{m}" for _, m in self.headline]
        values = [metrics[n] if n in metrics else metrics[self.dev_split][n.rpartition("/")[2]] for n in names]
        return sum(float(v) for v in values) / len(values)

    def references(self) -> dict[str, dict[str, Any]]:
        """Model-free reference levels beyond chance, by name: ``{"label": what it is, "split/metric":
        percent, ...}`` on every scored split (RefCOCO+: the class oracle). Empty for most tasks."""
        return {}

    def model_info(self) -> dict[str, Any]:
        """What else it takes to rebuild the head (model_config.json ``task``)."""
        return {}


class FinetuneModule(nn.Module):
    """What the DeepSpeed engine trains: ``forward(batch, stream)`` -> ``loss`` + float ``metrics``.

    The training loop (``pipeline.training.loop``) calls ``engine(batch, task)`` with the stream
    name as ``task``. Counts are dropped from the metrics: the loop averages per batch.
    """

    def __init__(self, task: FinetuneTask, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._task = task  # a plain attribute: not a module, not in the state dict

    def forward(self, batch: dict[str, Any], stream: str) -> SimpleNamespace:
        out = self._task.train_forward(self.model, batch, stream)
        metrics = {k: v for k, v in out.metrics.items() if not k.startswith("n_")}
        return SimpleNamespace(loss=out.loss, metrics=metrics)


def pooled(splits: tuple[str, ...]) -> str:
    """The name of splits scored together: ``("testA", "testB")`` -> ``"testA+testB"``."""
    return "+".join(splits)


def percent(correct: float, total: int) -> float:
    """100 * correct / total, rounded to 4 decimals (0.0 for an empty split)."""
    return round(100.0 * float(correct) / total, 4) if total else 0.0


def scored_items(db: TextDb, scores: Mapping[str, float]) -> dict[str, list]:
    """``item_scores`` of ``scores`` ({example id of ``db``: score in [0, 1]}), each example grouped
    by the images it is about (``db.txt2img``), in id order."""
    ids = sorted(scores)
    return item_scores(ids, [group_key(db.txt2img[e]) for e in ids], [scores[e] for e in ids])


@torch.no_grad()
def predict(model: nn.Module, batches, device: torch.device):
    """Yield ``(batch, output)`` for every batch, the model in eval mode (restored afterwards)."""
    from pipeline.training.engine import cast_batch

    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            inputs = {k: v for k, v in batch.items() if k != "targets"}
            yield batch, model(cast_batch(inputs, device, "fp32"))
    finally:
        model.train(was_training)
