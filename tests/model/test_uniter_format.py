"""UNITER's release format (model/uniter_format.py): round trips, strictness, and an independent check.

The independent check builds a state dict with the reference's names and evaluates the
reference's formulas (ChenRocks/UNITER model/model.py, read and rewritten here from its equations)
directly on it: text embedding LN(word + position + type), the image embedding
LN(LN(W_f x) + LN(W_p box) + type) with a masked region's feature replaced by the mask vector,
BERT layers over an additive -10000 padding mask, and the pooler tanh(W h_[CLS] + b).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from model.config import UniterConfig
from model.pretraining import UniterForPretraining
from model.uniter import UniterModel
from model.uniter_format import (
    UniterFormatError,
    from_uniter,
    load_uniter_state,
    release_shape,
    to_uniter,
)

H, LAYERS, HEADS_N, FFN, VOCAB, POS, D, C = 16, 2, 4, 32, 50, 24, 12, 6
EPS = 1e-12


def _config(**kw) -> UniterConfig:
    return UniterConfig(hidden_size=H, num_layers=LAYERS, num_heads=HEADS_N, intermediate_size=FFN, vocab_size=VOCAB,
                        max_position_embeddings=POS, hidden_dropout=0.0, attention_dropout=0.0, **kw)


def _randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter drawn at random (LayerNorm gains away from 1, biases away from 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b, lt, li = 3, 7, 5
    input_ids = torch.randint(1, VOCAB, (b, lt), generator=g)
    txt_mask = torch.ones(b, lt, dtype=torch.bool)
    txt_mask[1, 5:] = False
    input_ids[~txt_mask] = 0
    img_mask = torch.ones(b, li, dtype=torch.bool)
    img_mask[0, 3:] = False
    img_mask[2, 4:] = False
    img_feat = torch.rand(b, li, D, generator=g) * img_mask[..., None]
    img_pos = torch.rand(b, li, 7, generator=g) * img_mask[..., None]
    img_masked = torch.zeros(b, li, dtype=torch.bool)
    img_masked[0, 1] = img_masked[2, 0] = True
    return {"input_ids": input_ids, "txt_mask": txt_mask, "img_feat": img_feat, "img_pos": img_pos,
            "img_mask": img_mask, "img_masked": img_masked}


def _encode(model: UniterModel, batch) -> torch.Tensor:
    return model(batch["input_ids"], batch["txt_mask"], batch["img_feat"], batch["img_pos"], batch["img_mask"],
                 batch["img_masked"])


def _reference_state(seed: int) -> dict[str, torch.Tensor]:
    """A random state dict under the reference's UniterForPretraining names (written from its modules)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    s = {"uniter.embeddings.word_embeddings.weight": r(VOCAB, H),
         "uniter.embeddings.position_embeddings.weight": r(POS, H),
         "uniter.embeddings.token_type_embeddings.weight": r(2, H)}
    for ln in ("uniter.embeddings.LayerNorm", "uniter.img_embeddings.img_layer_norm",
               "uniter.img_embeddings.pos_layer_norm", "uniter.img_embeddings.LayerNorm"):
        s[f"{ln}.weight"], s[f"{ln}.bias"] = 1 + r(H), r(H)
    s["uniter.img_embeddings.img_linear.weight"], s["uniter.img_embeddings.img_linear.bias"] = r(H, D), r(H)
    s["uniter.img_embeddings.pos_linear.weight"], s["uniter.img_embeddings.pos_linear.bias"] = r(H, 7), r(H)
    s["uniter.img_embeddings.mask_embedding.weight"] = torch.cat([torch.zeros(1, D), r(1, D)])
    for i in range(LAYERS):
        p = f"uniter.encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            s[f"{p}{name}.weight"], s[f"{p}{name}.bias"] = r(H, H), r(H)
        s[f"{p}intermediate.dense.weight"], s[f"{p}intermediate.dense.bias"] = r(FFN, H), r(FFN)
        s[f"{p}output.dense.weight"], s[f"{p}output.dense.bias"] = r(H, FFN), r(H)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            s[f"{p}{ln}.weight"], s[f"{p}{ln}.bias"] = 1 + r(H), r(H)
    s["uniter.pooler.dense.weight"], s["uniter.pooler.dense.bias"] = r(H, H), r(H)
    # heads: BertOnlyMLMHead (decoder tied to the words), RegionFeatureRegression (weight tied to
    # img_linear), RegionClassification (Linear, GELU, LayerNorm, Linear), itm_output
    s["cls.predictions.transform.dense.weight"], s["cls.predictions.transform.dense.bias"] = r(H, H), r(H)
    s["cls.predictions.transform.LayerNorm.weight"], s["cls.predictions.transform.LayerNorm.bias"] = 1 + r(H), r(H)
    s["cls.predictions.bias"] = r(VOCAB)
    s["cls.predictions.decoder.weight"] = s["uniter.embeddings.word_embeddings.weight"]
    s["feat_regress.net.0.weight"], s["feat_regress.net.0.bias"] = r(H, H), r(H)
    s["feat_regress.net.2.weight"], s["feat_regress.net.2.bias"] = 1 + r(H), r(H)
    s["feat_regress.weight"], s["feat_regress.bias"] = s["uniter.img_embeddings.img_linear.weight"], r(D)
    s["region_classifier.net.0.weight"], s["region_classifier.net.0.bias"] = r(H, H), r(H)
    s["region_classifier.net.2.weight"], s["region_classifier.net.2.bias"] = 1 + r(H), r(H)
    s["region_classifier.net.3.weight"], s["region_classifier.net.3.bias"] = r(C, H), r(C)
    s["itm_output.weight"], s["itm_output.bias"] = r(2, H), r(2)
    return s


def _ln(x, s, name):
    return F.layer_norm(x, (H,), s[f"{name}.weight"], s[f"{name}.bias"], EPS)


def _lin(x, s, name):
    return x @ s[f"{name}.weight"].T + s[f"{name}.bias"]


def _reference_encoder(s, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's UniterModel forward, from its equations: (sequence output, pooled)."""
    ids, lt = batch["input_ids"], batch["input_ids"].shape[1]
    types = s["uniter.embeddings.token_type_embeddings.weight"]
    txt = s["uniter.embeddings.word_embeddings.weight"][ids] + s["uniter.embeddings.position_embeddings.weight"][:lt] \
        + types[0]
    txt = _ln(txt, s, "uniter.embeddings.LayerNorm")
    # the data loader zeroes a masked region's feature; the model adds mask_embedding[1] to it
    feat = batch["img_feat"].masked_fill(batch["img_masked"][..., None], 0.0)
    feat = feat + s["uniter.img_embeddings.mask_embedding.weight"][batch["img_masked"].long()]
    feat_emb = _ln(_lin(feat, s, "uniter.img_embeddings.img_linear"), s, "uniter.img_embeddings.img_layer_norm")
    box_emb = _ln(_lin(batch["img_pos"], s, "uniter.img_embeddings.pos_linear"), s,
                  "uniter.img_embeddings.pos_layer_norm")
    img = feat_emb + box_emb + types[1]
    img = _ln(img, s, "uniter.img_embeddings.LayerNorm")
    x = torch.cat([txt, img], dim=1)
    keep = torch.cat([batch["txt_mask"], batch["img_mask"]], dim=1).float()
    additive = (1.0 - keep)[:, None, None, :] * -10000.0
    b, length = x.shape[:2]
    dh = H // HEADS_N
    for i in range(LAYERS):
        p = f"uniter.encoder.layer.{i}."

        def heads(t):
            return t.view(b, length, HEADS_N, dh).transpose(1, 2)

        q, k, v = (heads(_lin(x, s, f"{p}attention.self.{n}")) for n in ("query", "key", "value"))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh) + additive, dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(b, length, H)
        x = _ln(x + _lin(ctx, s, f"{p}attention.output.dense"), s, f"{p}attention.output.LayerNorm")
        ffn = _lin(F.gelu(_lin(x, s, f"{p}intermediate.dense")), s, f"{p}output.dense")
        x = _ln(x + ffn, s, f"{p}output.LayerNorm")
    pooled = torch.tanh(_lin(x[:, 0], s, "uniter.pooler.dense"))
    return x, pooled


def test_imported_encoder_computes_the_reference_formulas():
    ref = _reference_state(seed=3)
    model = UniterForPretraining(_config(), img_dim=D, num_classes=C).eval()
    report = load_uniter_state(model, ref, needs={"mlm", "mrfr", "mrc", "itm"}, source="formulas")
    assert report.loaded_heads == ["mlm", "mrfr", "mrc", "itm"] and not report.skipped_heads
    batch = _batch()
    with torch.no_grad():
        sequence = _encode(model.uniter, batch)
        pooled = model.uniter.pool(sequence)
        expected_seq, expected_pooled = _reference_encoder(ref, batch)
    real = torch.cat([batch["txt_mask"], batch["img_mask"]], dim=1)  # padded positions carry no output
    assert torch.allclose(sequence[real], expected_seq[real], atol=2e-5), (sequence - expected_seq)[real].abs().max()
    assert torch.allclose(pooled, expected_pooled, atol=2e-5)
    # the masked region's vector is in use: without it the outputs differ
    unmasked = {**batch, "img_masked": torch.zeros_like(batch["img_masked"])}
    with torch.no_grad():
        assert not torch.allclose(_encode(model.uniter, unmasked)[real], sequence[real], atol=1e-3)
    # the heads: MLM's transform and tied decoder, ITM's classifier, MRC's two-layer net
    hidden = sequence[0, 1:3]
    with torch.no_grad():
        mlm = F.linear(model.mlm.transform(hidden), model.uniter.embeddings.word_embeddings.weight, model.mlm.bias)
        t = _ln(F.gelu(_lin(hidden, ref, "cls.predictions.transform.dense")), ref,
                "cls.predictions.transform.LayerNorm")
        assert torch.allclose(mlm, t @ ref["cls.predictions.decoder.weight"].T + ref["cls.predictions.bias"], atol=1e-5)
        mrc = model.mrc.classifier(model.mrc.transform(hidden))
        t = _ln(F.gelu(_lin(hidden, ref, "region_classifier.net.0")), ref, "region_classifier.net.2")
        assert torch.allclose(mrc, _lin(t, ref, "region_classifier.net.3"), atol=1e-5)
        assert torch.allclose(model.itm.classifier(pooled), _lin(pooled, ref, "itm_output"), atol=1e-6)


def test_export_then_import_reproduces_the_outputs_exactly():
    ours = _randomized(UniterForPretraining(_config(), img_dim=D, num_classes=C), seed=1)
    ref = to_uniter(ours.state_dict())
    assert len(ref) == 5 + 11 + 16 * LAYERS + 2 + 6 + 6 + 6 + 2  # 230 keys at 12 layers (UNITER-base)
    again = UniterForPretraining(_config(), img_dim=D, num_classes=C).eval()
    load_uniter_state(again, ref, needs={"mlm", "mrfr", "mrc", "itm"}, source="export")
    for key, value in ours.state_dict().items():
        assert torch.equal(value, again.state_dict()[key]), key
    batch = _batch(1)
    with torch.no_grad():
        assert torch.equal(_encode(ours.uniter, batch), _encode(again.uniter, batch))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_import_then_export_gives_back_the_file_bit_for_bit(dtype):
    ref = {k: v.to(dtype) for k, v in _reference_state(seed=5).items()}
    ref["cls.predictions.decoder.weight"] = ref["uniter.embeddings.word_embeddings.weight"]
    ref["feat_regress.weight"] = ref["uniter.img_embeddings.img_linear.weight"]
    model = UniterForPretraining(_config(), img_dim=D, num_classes=C)
    load_uniter_state(model, ref, needs=set(), source="release")  # fp16 loads into the fp32 model
    back = to_uniter(model.state_dict())
    assert sorted(back) == sorted(ref)
    for key, value in ref.items():
        assert torch.equal(back[key].to(dtype), value), key


def test_release_shape_reads_the_preset_and_sizes():
    shape = release_shape(_reference_state(seed=0))
    assert (shape.hidden_size, shape.num_layers, shape.vocab_size, shape.img_dim, shape.num_classes) == (
        H, LAYERS, VOCAB, D, C)
    assert shape.preset is None and shape.heads == ("mlm", "mrfr", "mrc", "itm")
    base = {k: torch.zeros(1) for k in ("uniter.embeddings.position_embeddings.weight",
                                          "uniter.embeddings.token_type_embeddings.weight")}
    base["uniter.embeddings.word_embeddings.weight"] = torch.zeros(28996, 768)
    base["uniter.img_embeddings.img_linear.weight"] = torch.zeros(768, 2048)
    base["uniter.encoder.layer.0.intermediate.dense.weight"] = torch.zeros(3072, 768)
    base.update({f"uniter.encoder.layer.{i}.output.dense.bias": torch.zeros(1) for i in range(12)})
    assert release_shape(base).preset == "base"
    with pytest.raises(UniterFormatError, match="not a UNITER checkpoint"):
        release_shape({"bert.embeddings.word_embeddings.weight": torch.zeros(2, 2)})


def test_every_bad_key_is_named_in_one_error():
    ref = _reference_state(seed=2)
    del ref["uniter.encoder.layer.1.attention.self.key.weight"]
    del ref["uniter.pooler.dense.bias"]
    ref["uniter.encoder.layer.0.output.dense.weight"] = torch.zeros(H, FFN + 1)
    ref["uniter.extra.weight"] = torch.zeros(1)
    ref["feat_regress.weight"] = torch.ones(H, D)  # no longer the image projection it is tied to
    model = UniterForPretraining(_config(), img_dim=D, num_classes=C)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UniterFormatError) as err:
        load_uniter_state(model, ref, needs={"mlm"}, source="bad.pt")
    message = str(err.value)
    for part in ("bad.pt", "attention.self.{key}.weight: missing", "uniter.pooler.dense.bias: missing",
                 "uniter.encoder.layer.0.output.dense.weight: shape (16, 33), the model expects (16, 32)",
                 "uniter.extra.weight: unexpected", "feat_regress.weight: differs from"):
        assert part in message, part
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # nothing copied


def test_heads_a_run_does_not_need_are_skipped_and_reported():
    ref = _reference_state(seed=4)
    for key in [k for k in ref if k.startswith("itm_output.")]:
        del ref[key]
    model = UniterForPretraining(_config(), img_dim=D, num_classes=C + 3)  # other detector classes: MRC misfits
    report = load_uniter_state(model, ref, needs={"mlm", "mrfr"}, source="r.pt")
    assert report.loaded_heads == ["mlm", "mrfr"]
    assert report.skipped_heads["itm"] == "not in the file"
    assert "shapes differ" in report.skipped_heads["mrc"]
    with pytest.raises(UniterFormatError, match="head itm .*missing, and this run needs it"):
        load_uniter_state(model, ref, needs={"itm"}, source="r.pt")
    with pytest.raises(UniterFormatError, match="region_classifier.net.3.weight: shape"):
        load_uniter_state(model, ref, needs={"mrc"}, source="r.pt")


def test_from_uniter_fuses_qkv_in_query_key_value_order():
    ref = _reference_state(seed=6)
    ours, problems = from_uniter(ref)
    assert problems == []
    qkv = ours["uniter.encoder.layers.1.attention.qkv.weight"]
    assert torch.equal(qkv[H:2 * H], ref["uniter.encoder.layer.1.attention.self.key.weight"])
    mask = ref["uniter.img_embeddings.mask_embedding.weight"]
    assert torch.equal(ours["uniter.img_embeddings.mask_embedding"], mask[1:])
    assert "cls.predictions.decoder.weight" not in ours and "feat_regress.weight" not in ours
