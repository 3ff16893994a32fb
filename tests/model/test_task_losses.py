"""The reference (ChenRocks/UNITER) task losses and segment types, each against a computation done
here by hand: VCR's per-row right/wrong loss, the retrieval hinge, SNLI-VE's one-hot BCE, the
RefCOCO+ head and summed loss, and the
segment-type rows that VCR and NLVR2 add (started from the text / region type as loaded)."""

from __future__ import annotations

import math

import pytest
import torch

from model.bert_init import default_bert_checkpoint, load_bert_weights, read_bert_state
from model.config import UniterConfig
from model.tasks import UniterForNlvr2, UniterForRefExp, UniterForSnliVe, UniterForVcr
from model.tasks.common import grouped_hinge_loss, row_choice_loss
from model.uniter import UniterModel, load_encoder_state

from tests.model.test_tasks import D, VOCAB, rows


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_row_choice_loss_by_hand():
    logits = [[0.3, -0.2], [1.0, 2.0], [-0.5, 0.5], [0.0, 0.1], [2.0, -1.0], [0.4, 0.4]]
    targets = [1, 2]  # row 1 of group 0, row 2 of group 1 (row 5 overall)
    labels = [0, 1, 0, 0, 0, 1]
    by_hand = sum(math.log(math.exp(a) + math.exp(b)) - (b if y else a) for (a, b), y in zip(logits, labels)) / 6
    loss = row_choice_loss(torch.tensor(logits), torch.tensor(targets))
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    with pytest.raises(ValueError, match="cannot be split"):
        row_choice_loss(torch.zeros(5, 2), torch.tensor([0, 1]))


def test_vcr_model_trains_the_row_loss_and_ranks_by_the_right_logit():
    torch.manual_seed(0)
    model = UniterForVcr(UniterConfig.from_preset("tiny", vocab_size=VOCAB, dropout=0.0), img_dim=D).eval()
    batch = dict(rows(8), txt_type_ids=torch.tensor([[0, 0, 0, 2, 2, 2, 3, 3]] * 8), targets=torch.tensor([3, 1]))
    out = model(batch)
    with torch.no_grad():
        two = model.head(model.uniter.pool(model.encode(batch)))
    labels = [0, 0, 0, 1, 0, 1, 0, 0]
    by_hand = sum(math.log(math.exp(a) + math.exp(b)) - (b if y else a) for (a, b), y in zip(two.tolist(), labels))
    assert out.loss.item() == pytest.approx(by_hand / 8, rel=1e-5)
    torch.testing.assert_close(out.logits, two[:, 1].view(2, 4))
    softmax = UniterForVcr(model.config, img_dim=D, loss="softmax").eval()
    softmax.load_state_dict(model.state_dict())
    lse = [math.log(sum(math.exp(v) for v in g)) for g in two[:, 1].view(2, 4).tolist()]
    expected = (lse[0] - two[3, 1].item() + lse[1] - two[5, 1].item()) / 2
    assert softmax(batch).loss.item() == pytest.approx(expected, rel=1e-5)


def test_grouped_hinge_loss_by_hand():
    scores = [2.0, 1.5, -1.0, 0.3, 0.1, 0.2, 0.25, -3.0]
    targets = [0, 2]  # groups of 4: positive at 0 in the first, at 2 in the second
    terms = []
    for g, t in enumerate(targets):
        group = [_sigmoid(s) for s in scores[4 * g : 4 * g + 4]]
        terms += [max(0.0, 0.2 + p - group[t]) for k, p in enumerate(group) if k != t]
    loss = grouped_hinge_loss(torch.tensor(scores), torch.tensor(targets), margin=0.2)
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-6)
    assert grouped_hinge_loss(torch.tensor([9.0, -9.0]), torch.tensor([0]), margin=0.2).item() == 0.0


def test_snli_ve_bce_by_hand():
    torch.manual_seed(1)
    model = UniterForSnliVe(UniterConfig.from_preset("tiny", vocab_size=VOCAB, dropout=0.0), img_dim=D).eval()
    batch = dict(rows(4), targets=torch.tensor([0, 2, 1, 2]))
    out = model(batch)
    by_hand = 0.0
    for row, t in zip(out.logits.tolist(), [0, 2, 1, 2]):
        by_hand += sum(-math.log(_sigmoid(x)) if c == t else -math.log(1 - _sigmoid(x)) for c, x in enumerate(row))
    assert out.loss.item() == pytest.approx(by_hand / 4, rel=1e-5)


def test_new_segment_types_start_from_their_source_row_as_loaded(tmp_path):
    torch.manual_seed(2)
    cfg = UniterConfig.from_preset("tiny", vocab_size=VOCAB)
    source = UniterModel(cfg, img_dim=D).state_dict()
    vcr, nlvr2 = UniterForVcr(cfg, img_dim=D), UniterForNlvr2(cfg, img_dim=D, variant="pair")
    for model, rows_from in ((vcr, {2: 0, 3: 0}), (nlvr2, {2: 1})):
        load_encoder_state(model, {"uniter." + k: v for k, v in source.items()})
        types = model.uniter.embeddings.token_type_embeddings.weight
        loaded = source["embeddings.token_type_embeddings.weight"]
        assert types.shape[0] == 2 + len(rows_from) and torch.equal(types[:2], loaded)
        for row, src in rows_from.items():
            assert torch.equal(types[row], loaded[src]), (type(model).__name__, row)
    # a 4-type checkpoint (the VCR pretraining export) is loaded as it is
    four = dict(source, **{"embeddings.token_type_embeddings.weight": torch.randn(4, cfg.hidden_size)})
    load_encoder_state(vcr, {"uniter." + k: v for k, v in four.items()})
    assert torch.equal(vcr.uniter.embeddings.token_type_embeddings.weight, four["embeddings.token_type_embeddings.weight"])
    # BERT's two rows: VCR's answer / rationale rows become BERT's text row
    small = UniterForVcr(UniterConfig.from_preset("small"), img_dim=D)
    load_bert_weights(small, default_bert_checkpoint())
    bert_types = read_bert_state(default_bert_checkpoint())["embeddings.token_type_embeddings.weight"]
    types = small.uniter.embeddings.token_type_embeddings.weight
    assert torch.equal(types[2], bert_types[0]) and torch.equal(types[3], bert_types[0])


def test_nlvr2_head_is_the_reference_linear_layer_unless_asked():
    cfg = UniterConfig.from_preset("tiny", vocab_size=VOCAB)
    assert isinstance(UniterForNlvr2(cfg, img_dim=D, variant="pair").head, torch.nn.Linear)
    assert UniterForNlvr2(cfg, img_dim=D, variant="triplet").head.in_features == cfg.hidden_size
    mlp = UniterForNlvr2(cfg, img_dim=D, variant="pair_biattn", head="mlp").head
    assert isinstance(mlp, torch.nn.Sequential) and mlp[0].in_features == 2 * cfg.hidden_size
    with pytest.raises(ValueError, match="unknown NLVR2 head"):
        UniterForNlvr2(cfg, img_dim=D, head="deep")


def test_segment_types_change_the_encoding():
    torch.manual_seed(3)
    model = UniterForNlvr2(UniterConfig.from_preset("tiny", vocab_size=VOCAB, dropout=0.0), img_dim=D, variant="pair")
    with torch.no_grad():
        model.uniter.embeddings.token_type_embeddings.weight[2] += torch.randn(32)  # as after some training
        batch = rows(2)
        left = model.encode(dict(batch, img_type_ids=torch.ones(2, 6, dtype=torch.long)))
        right = model.encode(dict(batch, img_type_ids=torch.full((2, 6), 2)))
    assert not torch.allclose(left, right)


def test_refexp_head_and_summed_loss_are_the_references():
    # UNITER's model/re.py with mlp=2 (its RefCOCO+ config): per region h [H],
    # score = w2 . LN(gelu(W1 h + b1)) + b2 with W1 [H, H], w2 [H] (erf GELU, LayerNorm eps 1e-12);
    # padded regions masked; train_re.py sums the per-expression CE over the batch
    torch.manual_seed(4)
    cfg = UniterConfig.from_preset("tiny", vocab_size=VOCAB, dropout=0.0)
    model = UniterForRefExp(cfg, img_dim=D).eval()
    h = cfg.hidden_size
    shapes = [tuple(p.shape) for p in model.head.parameters()]
    assert shapes == [(h, h), (h,), (h,), (h,), (1, h), (1,)]  # re_output.{0,2,3}: a reference checkpoint fits
    with torch.no_grad():
        for p in model.head.parameters():  # away from the LayerNorm's (1, 0) start, so every term counts
            p.add_(torch.randn_like(p) * 0.3)
    batch = dict(rows(3), targets=torch.tensor([4, 0, 2]))
    out = model(batch)
    with torch.no_grad():
        regions = model.encode(batch)[:, batch["input_ids"].shape[1]:].double()
        w1, b1, g, beta, w2, b2 = (p.double() for p in model.head.parameters())
        x = regions @ w1.T + b1
        x = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
        x = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-12) * g + beta
        scores = (x @ w2.T).squeeze(-1) + b2
        scores = scores.masked_fill(~batch["img_mask"], -1e4)
    real = batch["img_mask"]
    torch.testing.assert_close(out.logits.double()[real], scores[real], atol=1e-5, rtol=1e-5)
    by_hand = sum(torch.logsumexp(row, 0).item() - row[t].item() for row, t in zip(scores, [4, 0, 2]))
    assert out.loss.item() == pytest.approx(by_hand, rel=1e-5)
    assert out.metrics["loss"] == pytest.approx(by_hand, rel=1e-5)
