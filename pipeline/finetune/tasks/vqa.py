"""VQA: binary cross-entropy on soft scores over the answer vocabulary, official VQA accuracy.

Text DBs ``vqa_{train,val,test}`` (``answer_labels`` / ``answer_scores``: the soft targets over
``ans2label.json``, the vocabulary build_dbs kept from train+val). Evaluation predicts the top
answer of every dev (val) and test question, writes both in the submission format, and scores a
split by the official metric (``pipeline.finetune.tasks.vqa_eval``) against the ten human answers of the
manifest (``data/manifests/vqa.parquet``). Real test answers are not public (the evaluation server
scores the submission file): the test split is scored only when its answers were ingested, from the
mini world's evaluation-server file (``sources.vqa.annotations_test``); otherwise the results table
reports dev. Chance level: always answering the most frequent training answer.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import nn

from model.config import UniterConfig
from model.tasks import UniterForVqa
from pipeline.finetune.tasks.base import EvalResult, FinetuneTask, predict, scored_items
from pipeline.finetune.tasks.rows import TaskDataset, collate_rows, eval_batches, row, text_row
from pipeline.finetune.tasks.vqa_eval import evaluate_predictions, submission


class VqaTask(FinetuneTask):
    name = "vqa"
    streams = ("vqa",)
    headline = (("VQA {split} acc", "accuracy"),)

    def text_dbs(self) -> list[str]:
        return ["vqa_train", *(f"vqa_{s}" for s in self.splits.scored)]

    @functools.cached_property
    def ans2label(self) -> dict[str, int]:
        path = self.db("vqa_train").path / "ans2label.json"
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: the vqa_train text DB has no answer vocabulary")
        vocab = json.loads(path.read_text())
        if not vocab:
            raise ValueError(f"{path}: the answer vocabulary is empty (no answer reaches "
                             "build_dbs.vqa_min_answer_count)")
        return vocab

    @functools.cached_property
    def label2ans(self) -> list[str]:
        vocab = self.ans2label
        out = [""] * len(vocab)
        for answer, label in vocab.items():
            out[label] = answer
        return out

    def dataset(self, split: str, *, labelled_only: bool) -> TaskDataset:
        db = self.db(f"vqa_{split}")
        regions = self.regions
        ids = [e for e in db.ids if len(db[e]["answer_labels"])] if labelled_only else db.ids

        def build(index: int, eid: str, rec: dict[str, Any]) -> dict[str, Any]:
            return {"id": eid, "rows": [row(text_row(self.special, rec["input_ids"]), regions.get(rec["image_ids"]))],
                    "target": (rec["answer_labels"], rec["answer_scores"]), "question_id": str(rec["question_id"])}

        def row_len(eid: str) -> tuple[int, int, int]:
            return db.id2len[eid] + 2, regions.count(db.txt2img[eid]), 1

        return TaskDataset(db, ids, build=build, row_len=row_len)

    def train_dataset(self, stream: str) -> TaskDataset:
        # questions none of whose human answers is in the vocabulary teach nothing but "say nothing"
        return self.dataset("train", labelled_only=True)

    def held_out_dataset(self, stream: str) -> TaskDataset:
        return self.dataset(self.dev_split, labelled_only=True)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Rows + ``targets`` f32 [B, A] (soft scores) + ``question_ids``."""
        batch = collate_rows(items)
        targets = torch.zeros((len(items), len(self.ans2label)), dtype=torch.float32)
        for b, it in enumerate(items):
            labels, scores = it["target"]
            targets[b, torch.as_tensor(labels, dtype=torch.long)] = torch.as_tensor(scores, dtype=torch.float32)
        batch["targets"] = targets
        batch["question_ids"] = [it["question_id"] for it in items]
        return batch

    def build_model(self, config: UniterConfig, *, img_dim: int) -> nn.Module:
        return UniterForVqa(config, img_dim=img_dim, num_answers=len(self.ans2label))

    def predictions(self, model: nn.Module, split: str, device: torch.device) -> dict[str, str]:
        """{question_id: top answer} for every question of ``split``."""
        answers = self.label2ans
        ds = self.dataset(split, labelled_only=False)
        out: dict[str, str] = {}
        for batch, result in predict(model, eval_batches(ds, self.collate,
                                                         batch_tokens=self.ctx.cfg.eval_batch_tokens), device):
            for qid, label in zip(batch["question_ids"], result.logits.argmax(-1).tolist()):
                out[qid] = answers[label]
        return out

    @functools.cached_property
    def _manifest_answers(self) -> dict[str, dict[str, Any]]:
        """{example id: annotation} of every manifest question with human answers."""
        import pandas as pd

        path = Path(self.ctx.data) / "manifests" / "vqa.parquet"
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: VQA accuracy needs the human answers (run ingest@vqa)")
        frame = pd.read_parquet(path, columns=["example_id", "question_id", "answers", "answer_type"])
        return {r.example_id: {"question_id": str(r.question_id), "answers": list(r.answers),
                               "answer_type": r.answer_type}
                for r in frame.itertuples(index=False) if r.answers is not None}

    def human_answers(self, split: str) -> list[dict[str, Any]]:
        """Annotations of ``split``'s questions (those in its text DB) that have human answers:
        question_id, answers, answer_type; empty for a test split without its evaluation-server file."""
        known = self._manifest_answers
        return [known[e] for e in sorted(self.db(f"vqa_{split}").ids) if e in known]

    def test_labels_here(self) -> bool:
        return bool(self.human_answers(self.test_split))

    def scored_splits(self) -> list[str]:
        return [self.dev_split, *([self.test_split] if self.test_labelled() else [])]

    def evaluate(self, model: nn.Module, device: torch.device, *, artifacts: bool = True) -> EvalResult:
        """Accuracy on dev (and test when its answers are here); ``artifacts``: the predictions of
        every split in the submission format (the test file is what the evaluation server scores)."""
        metrics, files, items = {}, {}, {}
        for split in self.splits.scored:
            scored = split in self.scored_splits()
            if not (scored or artifacts):
                continue
            predicted = self.predictions(model, split, device)
            if scored:
                acc = evaluate_predictions(predicted, self.human_answers(split))
                metrics[split] = {"accuracy": acc.overall, "questions": acc.questions,
                                  **{f"accuracy_{t.replace('/', '_')}": v for t, v in acc.per_answer_type.items()}}
                items[f"{split}/accuracy"] = self.question_items(split, acc.per_question)
            if artifacts:
                files[f"vqa_predictions_{split}.json"] = submission(predicted)
        return EvalResult(metrics=metrics, artifacts=files, items=items)

    def question_items(self, split: str, per_question: dict[str, float]) -> dict[str, list]:
        """Per-item scores of ``split`` (the official accuracy of each question) by example id."""
        db, known = self.db(f"vqa_{split}"), self._manifest_answers
        example_of = {known[e]["question_id"]: e for e in db.ids if e in known}
        return scored_items(db, {example_of[q]: acc for q, acc in per_question.items()})

    def chance(self) -> dict[str, float]:
        """Always answering the most frequent training answer, on every scored split."""
        train = self.db("vqa_train")
        counts: Counter[int] = Counter()
        for e in train.ids:
            rec = train[e]
            for label, score in zip(rec["answer_labels"], rec["answer_scores"]):
                counts[int(label)] += float(score)
        majority = self.label2ans[counts.most_common(1)[0][0]]
        out = {}
        for split in self.scored_splits():
            annotations = self.human_answers(split)
            acc = evaluate_predictions({a["question_id"]: majority for a in annotations}, annotations)
            out[f"{split}/accuracy"] = acc.overall
        return out

    def model_info(self) -> dict[str, Any]:
        return {"num_answers": len(self.ans2label), "answers": self.label2ans}
