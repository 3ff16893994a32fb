"""Properties of conditional / joint masking, checked over 10k draws."""

from __future__ import annotations

import pytest
import torch

from model.masking import IGNORE_INDEX, mask_example, mask_regions, mask_tokens

VOCAB = 30522
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103
SPECIAL = (PAD, UNK, CLS, SEP, MASK)
DRAWS = 10_000


def _example(gen: torch.Generator, length: int = 20) -> torch.Tensor:
    body = torch.randint(1000, VOCAB, (length - 2,), generator=gen)
    return torch.cat([torch.tensor([CLS]), body, torch.tensor([SEP])])


def _mask(ids: torch.Tensor, gen: torch.Generator, p: float = 0.15):
    return mask_tokens(ids, mask_prob=p, vocab_size=VOCAB, mask_token_id=MASK, special_ids=SPECIAL, generator=gen)


def test_mask_tokens_rates_and_80_10_10():
    gen = torch.Generator().manual_seed(0)
    length, n_cand = 20, 18
    draws = [(ids, *_mask(ids, gen)) for ids in (_example(gen, length) for _ in range(DRAWS))]
    ids, masked, labels = (torch.stack(t) for t in zip(*draws))  # [DRAWS, length] each
    sel = labels != IGNORE_INDEX
    assert sel.any(1).all(), "every example must have at least one MLM target"
    assert not sel[:, 0].any() and not sel[:, -1].any(), "[CLS]/[SEP] must never be selected"
    assert torch.equal(labels[sel], ids[sel])
    assert torch.equal(masked[~sel], ids[~sel]), "unselected tokens must be untouched"
    assert not torch.isin(masked[sel & (masked != MASK)], torch.tensor(SPECIAL)).any()
    selected = int(sel.sum())
    n_mask = int((masked[sel] == MASK).sum())
    same = masked[sel] == ids[sel]
    n_keep = int(same.sum())
    n_random = int(((masked[sel] != MASK) & ~same).sum())
    p = 0.15
    # Expected rate including the at-least-one rule: p + P(nothing selected) / n_cand.
    expected = p + (1 - p) ** n_cand / n_cand
    rate = selected / (DRAWS * n_cand)
    assert abs(rate - expected) < 0.004, (rate, expected)
    assert abs(n_mask / selected - 0.8) < 0.012
    assert abs(n_random / selected - 0.1) < 0.01
    assert abs(n_keep / selected - 0.1) < 0.01


def test_mask_tokens_at_least_one_even_for_tiny_prob():
    gen = torch.Generator().manual_seed(1)
    ids = torch.tensor([CLS, 2000, SEP])
    for _ in range(200):
        _, labels = _mask(ids, gen, p=1e-6)
        assert labels.tolist() == [IGNORE_INDEX, 2000, IGNORE_INDEX]


def test_mask_tokens_errors_and_determinism():
    gen = torch.Generator().manual_seed(2)
    with pytest.raises(ValueError, match="no maskable token"):
        _mask(torch.tensor([CLS, SEP]), gen)
    with pytest.raises(ValueError, match=r"shape \[L\]"):
        _mask(torch.ones(2, 3, dtype=torch.long), gen)
    ids = _example(torch.Generator().manual_seed(3), 40)
    a = _mask(ids, torch.Generator().manual_seed(7))
    b = _mask(ids, torch.Generator().manual_seed(7))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_random_replacement_covers_vocab_without_specials():
    gen = torch.Generator().manual_seed(4)
    ids = torch.full((200,), 5000)
    seen = []
    for _ in range(300):
        masked, _ = _mask(ids, gen, p=1.0)
        seen.append(masked[(masked != MASK) & (masked != 5000)])
    seen = torch.cat(seen)
    assert seen.numel() > 4000
    assert not torch.isin(seen, torch.tensor(SPECIAL)).any()
    assert int(seen.min()) < 200 and int(seen.max()) > VOCAB - 200  # spans the vocabulary


def test_mask_regions_rate_and_at_least_one():
    gen = torch.Generator().manual_seed(5)
    n, total = 36, 0
    for _ in range(DRAWS):
        m = mask_regions(n, mask_prob=0.15, generator=gen)
        assert m.dtype == torch.bool and m.shape == (n,) and m.any()
        total += int(m.sum())
    expected = 0.15 + 0.85**n / n
    assert abs(total / (DRAWS * n) - expected) < 0.004
    assert mask_regions(1, mask_prob=0.0, generator=gen).tolist() == [True]
    with pytest.raises(ValueError, match="at least one region"):
        mask_regions(0, mask_prob=0.15, generator=gen)


def _draw(scheme: str, task: str, gen: torch.Generator):
    ids = _example(gen, int(torch.randint(3, 30, (1,), generator=gen)))
    n_regions = int(torch.randint(1, 50, (1,), generator=gen))
    out = mask_example(
        ids,
        n_regions,
        task=task,
        scheme=scheme,
        mask_prob=0.15,
        vocab_size=VOCAB,
        mask_token_id=MASK,
        special_ids=SPECIAL,
        generator=gen,
    )
    assert out.input_ids.shape == ids.shape == out.txt_labels.shape and out.img_masked.shape == (n_regions,)
    return bool((out.txt_labels != IGNORE_INDEX).any()), bool(out.img_masked.any()), out, ids


def test_conditional_masking_never_masks_both_modalities():
    gen = torch.Generator().manual_seed(6)
    tasks = ("mlm", "mrfr", "mrc", "mrc_kl", "itm")
    counts = {t: 0 for t in tasks}
    for i in range(DRAWS):
        task = tasks[i % len(tasks)]
        text, image, out, ids = _draw("conditional", task, gen)
        assert not (text and image), f"draw {i} ({task}) masked both modalities"
        if task == "mlm":
            assert text and not image
        elif task == "itm":
            assert not text and not image and torch.equal(out.input_ids, ids)
        else:
            assert image and not text and torch.equal(out.input_ids, ids)
        counts[task] += 1
    assert min(counts.values()) == DRAWS // len(tasks)


def test_joint_masking_masks_both_modalities():
    gen = torch.Generator().manual_seed(8)
    for i in range(DRAWS // 2):
        task = ("mlm", "mrfr", "mrc_kl")[i % 3]
        text, image, _, _ = _draw("joint", task, gen)
        assert text and image
    text, image, _, _ = _draw("joint", "itm", gen)
    assert not text and not image
    with pytest.raises(ValueError, match="unknown task"):
        _draw("conditional", "vqa", gen)
    with pytest.raises(ValueError, match="unknown masking scheme"):
        _draw("both", "mlm", gen)
