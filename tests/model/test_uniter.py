"""The encoder against independent references: HF BertModel, the paper's parameter counts."""

from __future__ import annotations

import pytest
import torch

from model.bert_init import read_bert_state
from model.config import UniterConfig
from model.uniter import UniterModel, default_bert_checkpoint, load_bert_weights, load_encoder_state


def _count(module: torch.nn.Module, skip: tuple[str, ...]) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if not n.startswith(skip))


@pytest.mark.parametrize("preset,paper", [("base", 86e6), ("large", 303e6)])
def test_parameter_counts_match_paper(preset, paper):
    # The paper's 86M / 303M are BERT-base / BERT-large without the word embeddings: encoder
    # layers, position + segment embeddings, embedding LayerNorm and pooler (86.04M / 303.89M
    # here). UNITER's image embedder (2048->H projection, 7->H box projection, 3 LayerNorms)
    # adds 1.58M / 2.11M, which the rounded figures leave out; with it we are +1.9% / +1.0%.
    with torch.device("meta"):
        model = UniterModel(UniterConfig.from_preset(preset), img_dim=2048)
    text_side = _count(model, ("embeddings.word_embeddings", "img_embeddings"))
    everything = _count(model, ("embeddings.word_embeddings",))
    assert abs(text_side / paper - 1) < 0.02, text_side
    assert abs(everything / paper - 1) < 0.02, everything


def test_small_preset_is_minilm_shape():
    cfg = UniterConfig.from_preset("small")
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size) == (6, 384, 12, 1536)
    with pytest.raises(ValueError, match="unknown preset"):
        UniterConfig.from_preset("huge")
    with pytest.raises(ValueError, match="unknown field"):
        UniterConfig.from_preset("tiny", hiden_size=3)
    assert UniterConfig.from_preset("tiny", dropout=0.0).attention_dropout == 0.0


def _text_batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30522, (3, 17), generator=gen)
    ids[:, 0] = 101
    mask = torch.ones(3, 17, dtype=torch.bool)
    mask[1, 10:] = False
    mask[2, 5:] = False
    ids[~mask] = 0
    ids[0, 16], ids[1, 9], ids[2, 4] = 102, 102, 102
    return ids, mask


def test_text_forward_equals_transformers_bert():
    transformers = pytest.importorskip("transformers")
    path = default_bert_checkpoint()
    model = UniterModel(UniterConfig.from_preset("small"), img_dim=2048).eval()
    report = load_bert_weights(model, path)
    assert report.unused == ()
    reference = transformers.BertModel.from_pretrained(str(path.parent), local_files_only=True).eval()
    ids, mask = _text_batch()
    with torch.no_grad():
        ours = model(ids, mask)
        theirs = reference(input_ids=ids, attention_mask=mask.long())
    assert (ours - theirs.last_hidden_state)[mask].abs().max() < 1e-5
    assert (model.pool(ours) - theirs.pooler_output).abs().max() < 1e-5


def test_fresh_pooler_start_keeps_the_bert_style_init_and_loads_everything_else():
    state = read_bert_state(default_bert_checkpoint())
    # the shipped MiniLM's pooler was never trained (bias all zero, weights at std ~0.009): the
    # reason for the switch (docs/decisions.md#pooler-start)
    assert state["pooler.dense.bias"].abs().max() == 0
    torch.manual_seed(5)
    fresh = UniterModel(UniterConfig.from_preset("small", pooler_start="fresh"), img_dim=8)
    init = fresh.pooler.dense.weight.clone()
    report = load_bert_weights(fresh, default_bert_checkpoint())
    assert report.unused == ()
    assert torch.equal(fresh.pooler.dense.weight, init)
    assert abs(init.std().item() - fresh.config.initializer_range) < 1e-3
    copied = UniterModel(UniterConfig.from_preset("small"), img_dim=8)
    full = load_bert_weights(copied, default_bert_checkpoint())
    assert torch.equal(copied.pooler.dense.weight, state["pooler.dense.weight"])
    assert set(full.loaded) - set(report.loaded) == {"uniter.pooler.dense.weight", "uniter.pooler.dense.bias"}
    assert torch.equal(fresh.embeddings.word_embeddings.weight, copied.embeddings.word_embeddings.weight)
    with pytest.raises(ValueError, match="pooler_start must be one of"):
        UniterConfig.from_preset("tiny", pooler_start="bert")


def test_load_bert_weights_from_torch_file_and_shape_errors(tmp_path):
    state = read_bert_state(default_bert_checkpoint())
    pt = tmp_path / "bert.pt"
    torch.save({"bert." + k: v for k, v in state.items()}, pt)
    model = UniterModel(UniterConfig.from_preset("small"), img_dim=8)
    load_bert_weights(model, pt)
    assert torch.equal(model.embeddings.word_embeddings.weight, state["embeddings.word_embeddings.weight"])
    q = state["encoder.layer.3.attention.self.value.weight"]
    assert torch.equal(model.encoder.layers[3].attention.qkv.weight[2 * 384 :], q)
    tiny = UniterModel(UniterConfig.from_preset("tiny"), img_dim=8)
    before = tiny.embeddings.norm.bias.clone()
    with pytest.raises(
        ValueError, match=r"bert.pt: embeddings.LayerNorm.bias has shape \(384,\), the model expects \(32,\)"
    ):
        load_bert_weights(tiny, pt)
    assert torch.equal(tiny.embeddings.norm.bias, before), "a failed load must not change the model"
    grown = UniterModel(UniterConfig.from_preset("small", vocab_size=30530), img_dim=8)
    new_rows = grown.embeddings.word_embeddings.weight[30522:].clone()
    load_bert_weights(grown, pt)  # a tokenizer with 8 added tokens: BERT rows copied, new rows kept
    assert torch.equal(grown.embeddings.word_embeddings.weight[:30522], state["embeddings.word_embeddings.weight"])
    assert torch.equal(grown.embeddings.word_embeddings.weight[30522:], new_rows)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_bert_weights(model, tmp_path / "missing.safetensors")


def _image_inputs(b, li, d, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, li, d, generator=gen),
        torch.rand(b, li, 7, generator=gen),
        torch.ones(b, li, dtype=torch.bool),
    )


def test_padding_does_not_change_real_outputs():
    torch.manual_seed(0)
    model = UniterModel(UniterConfig.from_preset("tiny"), img_dim=12).eval()
    ids, mask = _text_batch()
    feat, pos, img_mask = _image_inputs(3, 5, 12)
    with torch.no_grad():
        out = model(ids, mask, feat, pos, img_mask)
        pad = 4
        out_padded = model(
            torch.cat([ids, torch.zeros(3, pad, dtype=torch.long)], 1),
            torch.cat([mask, torch.zeros(3, pad, dtype=torch.bool)], 1),
            torch.cat([feat, torch.randn(3, pad, 12)], 1),
            torch.cat([pos, torch.rand(3, pad, 7)], 1),
            torch.cat([img_mask, torch.zeros(3, pad, dtype=torch.bool)], 1),
        )
    assert out.shape == (3, 17 + 5, 32) and out_padded.shape == (3, 17 + pad + 5 + pad, 32)
    torch.testing.assert_close(out[:, :17][mask], out_padded[:, :17][mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(out[:, 17:], out_padded[:, 17 + pad : 17 + pad + 5], atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm", ["none", "standardize"])
def test_masked_regions_get_the_mask_embedding_and_inputs_checked(norm):
    """UNITER's UniterImageEmbeddings: a masked region's (projected-side) feature is zero plus the
    learned mask vector, which gets gradient from masked regions only."""
    torch.manual_seed(1)
    model = UniterModel(UniterConfig.from_preset("tiny", region_feature_norm=norm), img_dim=12).eval()
    ids, mask = _text_batch()
    feat, pos, img_mask = _image_inputs(3, 5, 12)
    masked = torch.zeros(3, 5, dtype=torch.bool)
    masked[:, 2] = True
    emb = model.img_embeddings
    assert emb.mask_embedding.shape == (1, 12) and emb.mask_embedding.abs().sum() > 0
    with torch.no_grad():
        a = model(ids, mask, feat, pos, img_mask, masked)
        c = model(ids, mask, feat, pos, img_mask)
        # by hand: the projection's input with row 2 replaced by the mask vector
        inputs = emb.project_input(feat)
        inputs[:, 2] = emb.mask_embedding[0]
        by_hand = emb.norm(emb.feat_norm(emb.feat_proj(inputs)) + emb.pos_norm(emb.pos_proj(pos))
                           + model.embeddings.token_type_embeddings.weight[1])
        torch.testing.assert_close(emb(feat, pos, model.embeddings.token_type_embeddings.weight[1], masked), by_hand)
    assert not torch.allclose(a, c)
    model(ids, mask, feat, pos, img_mask).sum().backward()
    assert emb.mask_embedding.grad is None or emb.mask_embedding.grad.abs().sum() == 0
    model(ids, mask, feat, pos, img_mask, masked).sum().backward()
    assert emb.mask_embedding.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="img_dim=12"):
        model(ids, mask, torch.randn(3, 5, 11), pos, img_mask)
    with pytest.raises(ValueError, match="without img_pos"):
        model(ids, mask, feat)


def test_centered_boxes_are_the_raw_boxes_shifted_by_half():
    """region_box_norm center: the box projection reads ``box - 0.5`` (UNITER, ``none``: the box as
    it is); the weights are the same, so only the input differs."""
    torch.manual_seed(2)
    raw = UniterModel(UniterConfig.from_preset("tiny", region_box_norm="none"), img_dim=12).eval()
    centered = UniterModel(UniterConfig.from_preset("tiny", region_box_norm="center"), img_dim=12).eval()
    centered.load_state_dict(raw.state_dict())
    feat, pos, _ = _image_inputs(3, 5, 12)
    type_emb = raw.embeddings.token_type_embeddings.weight[1]
    with torch.no_grad():
        torch.testing.assert_close(centered.img_embeddings(feat, pos, type_emb),
                                   raw.img_embeddings(feat, pos - 0.5, type_emb))
        assert not torch.allclose(centered.img_embeddings(feat, pos, type_emb), raw.img_embeddings(feat, pos, type_emb))
    with pytest.raises(ValueError, match="region_box_norm"):
        UniterConfig.from_preset("tiny", region_box_norm="scale")


def test_a_zero_box_start_adds_no_box_until_training_grows_its_gain():
    """region_box_start zero: ``pos_norm``'s gain starts at 0 (UNITER, ``reference``: 1), so at the
    start the region embedding does not depend on the box at all; the gain's gradient is nonzero,
    so training can grow the box branch; everything else starts as under ``reference``."""
    torch.manual_seed(3)
    ref = UniterModel(UniterConfig.from_preset("tiny"), img_dim=12)
    torch.manual_seed(3)
    zero = UniterModel(UniterConfig.from_preset("tiny", region_box_start="zero"), img_dim=12)
    emb = zero.img_embeddings
    assert torch.equal(emb.pos_norm.weight, torch.zeros_like(emb.pos_norm.weight))
    assert torch.equal(ref.img_embeddings.pos_norm.weight, torch.ones_like(emb.pos_norm.weight))
    differ = [k for k, v in zero.state_dict().items() if not torch.equal(v, ref.state_dict()[k])]
    assert differ == ["img_embeddings.pos_norm.weight"]
    feat, pos, _ = _image_inputs(3, 5, 12)
    type_emb = zero.embeddings.token_type_embeddings.weight[1]
    zero.eval()
    out = emb(feat, pos, type_emb)
    # pos_norm's bias (0 at the start) is all the box branch adds
    torch.testing.assert_close(out, emb(feat, torch.rand_like(pos), type_emb), rtol=0, atol=0)
    out.pow(2).sum().backward()
    assert emb.pos_norm.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="region_box_start"):
        UniterConfig.from_preset("tiny", region_box_start="one")


def test_region_embeddings_ignore_common_mode_weight_updates():
    """Adam's first updates of the feature projection on non-negative detector features have the
    form ``u 1^T`` (one sign per weight row); they used to shift every region the same way until
    all regions looked alike. The standardized input makes such an update a no-op, while a
    region-specific change of the input still changes that region only (``region_feature_norm:
    standardize``; UNITER's raw input has no such protection)."""
    torch.manual_seed(3)
    model = UniterModel(UniterConfig.from_preset("tiny", dropout=0.0, region_feature_norm="standardize"),
                        img_dim=12).eval()
    emb = model.img_embeddings
    feat = torch.relu(torch.randn(2, 6, 12) + 0.5)  # non-negative, like pooled ReLU features
    pos, type_emb = torch.rand(2, 6, 7), torch.zeros(32)
    with torch.no_grad():
        before = emb(feat, pos, type_emb)
        emb.feat_proj.weight += 0.05 * torch.randn(32, 1) * torch.ones(1, 12)
        after = emb(feat, pos, type_emb)
        changed = feat.clone()
        changed[0, 2] = torch.relu(torch.randn(12) + 0.5)
        moved = emb(changed, pos, type_emb)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)
    assert not torch.allclose(moved[0, 2], after[0, 2], atol=1e-3)
    torch.testing.assert_close(moved[:, [0, 1, 3, 4, 5]], after[:, [0, 1, 3, 4, 5]])
    raw = UniterModel(UniterConfig.from_preset("tiny", dropout=0.0), img_dim=12).eval().img_embeddings
    with torch.no_grad():
        before = raw(feat, pos, type_emb)
        raw.feat_proj.weight += 0.05 * torch.randn(32, 1) * torch.ones(1, 12)
        assert not torch.allclose(raw(feat, pos, type_emb), before, atol=1e-3)



def test_load_encoder_state_roundtrip_with_grown_types():
    torch.manual_seed(2)
    src = UniterModel(UniterConfig.from_preset("tiny"), img_dim=12)
    dst = UniterModel(UniterConfig.from_preset("tiny"), img_dim=12)
    dst.grow_type_vocab(3)
    holder = torch.nn.Module()
    holder.uniter = dst
    load_encoder_state(holder, {"uniter." + k: v for k, v in src.state_dict().items()})
    torch.testing.assert_close(dst.encoder.layers[1].ffn_in.weight, src.encoder.layers[1].ffn_in.weight)
    types = dst.embeddings.token_type_embeddings.weight
    assert types.shape[0] == 3 and torch.equal(types[:2], src.embeddings.token_type_embeddings.weight)
    with pytest.raises(ValueError, match="no key starts with"):
        load_encoder_state(holder, {"encoder.x": torch.zeros(1)})


def test_set_dropout_switches_every_dropout_and_puts_the_config_back():
    from model.layers import SelfAttention, set_dropout

    torch.manual_seed(0)
    model = UniterModel(UniterConfig.from_preset("tiny"), img_dim=12).train()
    ids, mask = torch.randint(1000, 2000, (2, 5)), torch.ones(2, 5, dtype=torch.bool)
    feat, pos, img_mask = torch.randn(2, 3, 12), torch.rand(2, 3, 7), torch.ones(2, 3, dtype=torch.bool)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def probabilities() -> set[float]:
        return {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} | \
               {m.dropout_p for m in model.modules() if isinstance(m, SelfAttention)}

    assert probabilities() == {0.1}
    assert not torch.equal(model(ids, mask, feat, pos, img_mask), model(ids, mask, feat, pos, img_mask))
    set_dropout(model, 0.0)
    assert probabilities() == {0.0}
    # no dropout anywhere: a training-mode forward is deterministic and equals evaluation mode's
    out = model(ids, mask, feat, pos, img_mask)
    assert torch.equal(out, model(ids, mask, feat, pos, img_mask))
    assert torch.allclose(out, model.eval()(ids, mask, feat, pos, img_mask))
    set_dropout(model, None)
    assert probabilities() == {0.1}
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
