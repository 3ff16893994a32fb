"""model/region_init.py: the class-name start of the region projection, checked against numpy's
least squares and on regions whose class is recoverable from their features."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model.region_init import class_name_embeddings, class_name_projection
from model.uniter import FEATURE_STD_EPS, ImageEmbeddings, UniterConfig


def test_name_embeddings_average_the_wordpieces():
    words = torch.arange(12, dtype=torch.float32).view(6, 2)
    emb = class_name_embeddings(words, [[], [1], [2, 4]])
    assert emb.tolist() == [[0.0, 0.0], [2.0, 3.0], [6.0, 7.0]]
    with pytest.raises(ValueError, match="outside the vocabulary of 6"):
        class_name_embeddings(words, [[6]])


def test_fit_matches_numpy_least_squares():
    gen = torch.Generator().manual_seed(0)
    features = torch.rand(400, 16, generator=gen) * 3
    soft = torch.softmax(torch.randn(400, 5, generator=gen) * 2, dim=1)
    names = torch.randn(5, 8, generator=gen)
    weight, bias = class_name_projection(features, soft, names, feature_eps=FEATURE_STD_EPS, ridge=1e-9)
    x = F.layer_norm(features.double(), (16,), eps=FEATURE_STD_EPS).numpy()
    design = np.concatenate([x, np.ones((400, 1))], axis=1)
    # standardized rows sum to 0, so the design is rank D (not D + 1): lstsq's minimum-norm answer
    # and the centered ridge fit give the same predictions, which is what the model sees
    coef, *_ = np.linalg.lstsq(design, (soft.double() @ names.double()).numpy(), rcond=None)
    ours = x @ weight.double().numpy().T + bias.double().numpy()
    np.testing.assert_allclose(ours, design @ coef, atol=1e-5)
    assert weight.shape == (8, 16) and bias.shape == (8,) and weight.dtype == torch.float32


def test_fit_on_raw_features_matches_numpy_least_squares():
    """UNITER's input (model.region_feature_norm none): the fit reads the raw features."""
    gen = torch.Generator().manual_seed(2)
    features = torch.rand(300, 12, generator=gen) * 3
    soft = torch.softmax(torch.randn(300, 4, generator=gen) * 2, dim=1)
    names = torch.randn(4, 6, generator=gen)
    weight, bias = class_name_projection(features, soft, names, feature_eps=None, ridge=1e-12)
    design = np.concatenate([features.double().numpy(), np.ones((300, 1))], axis=1)
    coef, *_ = np.linalg.lstsq(design, (soft.double() @ names.double()).numpy(), rcond=None)
    np.testing.assert_allclose(weight.double().numpy().T, coef[:-1], atol=1e-5)
    np.testing.assert_allclose(bias.double().numpy(), coef[-1], atol=1e-5)


@pytest.mark.parametrize("norm", ["none", "standardize"])
def test_regions_start_at_their_class_names_inside_the_embedder(norm):
    gen = torch.Generator().manual_seed(1)
    num_classes, dim, hidden = 6, 32, 16
    prototypes = torch.rand(num_classes, dim, generator=gen) * 4  # non-negative, like detector features
    labels = torch.randint(1, num_classes, (600,), generator=gen)
    features = (prototypes[labels] + 0.1 * torch.rand(600, dim, generator=gen)).clamp_min(0)
    soft = F.one_hot(labels, num_classes).float()
    names = torch.randn(num_classes, hidden, generator=gen)
    names[0] = 0  # background: no name
    eps = FEATURE_STD_EPS if norm == "standardize" else None
    weight, bias = class_name_projection(features, soft, names, feature_eps=eps)
    embedder = ImageEmbeddings(UniterConfig(hidden_size=hidden, num_layers=1, num_heads=2, intermediate_size=32,
                                            region_feature_norm=norm), dim)
    with torch.no_grad():
        embedder.feat_proj.weight.copy_(weight)
        embedder.feat_proj.bias.copy_(bias)
    projected = embedder.feat_proj(embedder.project_input(features))
    cos = F.cosine_similarity(projected[:, None, :], names[None, 1:, :], dim=-1)  # vs every named class
    assert (cos.argmax(1) + 1 == labels).float().mean() == 1.0
    assert cos.gather(1, (labels - 1)[:, None]).min() > 0.95


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="same N"):
        class_name_projection(torch.rand(5, 4), torch.rand(6, 3), torch.rand(3, 2), feature_eps=1e-5)
    with pytest.raises(ValueError, match="3 classes in soft_labels but 2 name embeddings"):
        class_name_projection(torch.rand(5, 4), torch.rand(5, 3), torch.rand(2, 2), feature_eps=1e-5)
