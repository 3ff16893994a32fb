"""``encoder_in_precision``: evaluation in the training precision, with fp32 scores."""

from __future__ import annotations

import pytest
import torch

from model.config import UniterConfig
from model.tasks.retrieval import UniterForRetrieval
from pipeline.finetune.runner import encoder_in_precision

CPU = torch.device("cpu")


def _model_and_batch(rows: int = 4, lt: int = 6, li: int = 5, img_dim: int = 16):
    torch.manual_seed(0)
    model = UniterForRetrieval(UniterConfig.from_preset("tiny"), img_dim=img_dim).eval()
    batch = {"input_ids": torch.randint(1000, 2000, (rows, lt)), "txt_mask": torch.ones(rows, lt, dtype=torch.bool),
             "img_feat": torch.rand(rows, li, img_dim), "img_pos": torch.rand(rows, li, 7),
             "img_mask": torch.ones(rows, li, dtype=torch.bool)}
    return model, batch


def _encoder_autocast_states(model) -> list[bool]:
    seen: list[bool] = []
    model.uniter.encoder.register_forward_pre_hook(lambda *_: seen.append(torch.is_autocast_enabled("cpu")))
    return seen


@pytest.mark.parametrize("precision", ["bf16_autocast", "bf16"])
def test_the_encoder_runs_in_bf16_and_the_scores_stay_fp32(precision):
    model, batch = _model_and_batch()
    seen = _encoder_autocast_states(model)
    with torch.no_grad():
        reference = model(batch).logits
        with encoder_in_precision(model, precision, CPU) as evaluated:
            scores = evaluated(batch).logits
    assert seen == [False, True]  # the fp32 reference call, then the call inside the context
    assert scores.dtype == torch.float32
    assert not torch.equal(scores, reference)  # the encoder's matmuls really ran in bf16
    torch.testing.assert_close(scores, reference, atol=0.05, rtol=0.05)


def test_fp32_runs_leave_the_model_alone_and_the_forward_is_restored():
    model, batch = _model_and_batch()
    seen = _encoder_autocast_states(model)
    with torch.no_grad():
        reference = model(batch).logits
        with encoder_in_precision(model, "fp32", CPU) as evaluated:
            assert torch.equal(evaluated(batch).logits, reference)
        with encoder_in_precision(model, "bf16_autocast", CPU):
            pass
        assert torch.equal(model(batch).logits, reference)  # bf16 no longer: the class's forward again
    assert "forward" not in vars(model.uniter)
    assert seen == [False, False, False]
