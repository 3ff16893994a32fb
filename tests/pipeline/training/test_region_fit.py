"""pipeline/training/region_init.py on build_dbs' synthetic world: which regions the fit reads,
that it lands in the model, and that disagreeing or missing class names are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.dbs_synthetic import built_world

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return built_world(tmp_path_factory.mktemp("region_init") / "data")


def _group(data: Path):
    from pipeline.stores.readers import ImageDbGroup, TextDb
    from pipeline.training.region_init import training_image_keys

    txt = TextDb(data / "db/txt/pretrain_indomain_train")
    return ImageDbGroup(data / "db/img", txt.img_db_names), txt.meta, training_image_keys([txt])


def test_sample_reads_every_region_of_the_drawn_training_images_only(data):
    from pipeline.stores.readers import TextDb
    from pipeline.training.region_init import sample_regions

    group, _, keys = _group(data)
    # the image DBs hold more than the pretraining training images (eval and val images too)
    every = {f"{name}/{i}" for name, db in group.dbs.items() for i in db.nbb}
    val = {k for ks in TextDb(data / "db/txt/pretrain_indomain_val").txt2img.values() for k in ks}
    assert set(keys) < every and val and not val & set(keys)
    total = sum(group.num_regions(k) for k in keys)
    feats, soft = sample_regions(group, image_keys=keys, max_images=10_000, seed=0)
    assert feats.shape == (total, group.feature_dim) and soft.shape == (total, group.num_classes)
    few, _ = sample_regions(group, image_keys=keys, max_images=3, seed=0)
    again, _ = sample_regions(group, image_keys=keys, max_images=3, seed=0)
    assert torch.equal(few, again) and 0 < few.shape[0] < total


@pytest.mark.parametrize("norm", ["none", "standardize"])
def test_fit_is_written_into_the_region_projection(data, norm):
    """The fit reads what the projection reads: raw features (UNITER's input) or standardized ones."""
    from model.region_init import class_name_embeddings, class_name_projection
    from model.uniter import FEATURE_STD_EPS, UniterConfig, UniterModel
    from pipeline.stores.tokenization import WordPieceTokenizer
    from pipeline.training.region_init import init_region_projection, sample_regions, shared_class_names

    group, meta, keys = _group(data)
    config = UniterConfig.from_preset("tiny", vocab_size=int(meta["vocab_size"]), region_feature_norm=norm)
    model = UniterModel(config, img_dim=group.feature_dim)
    report = init_region_projection(model, group, meta, image_keys=keys, max_images=6, seed=3)
    feats, soft = sample_regions(group, image_keys=keys, max_images=6, seed=3)
    tok = WordPieceTokenizer(meta["tokenizer"])
    names = class_name_embeddings(model.embeddings.word_embeddings.weight.detach(),
                                  [tok.encode(n) for n in shared_class_names(group)])
    weight, bias = class_name_projection(feats, soft, names, feature_eps=FEATURE_STD_EPS if norm == "standardize"
                                         else None)
    assert torch.equal(model.img_embeddings.feat_proj.weight, weight)
    assert torch.equal(model.img_embeddings.feat_proj.bias, bias)
    assert report["regions"] == feats.shape[0] and report["classes"] == len(shared_class_names(group))
    assert 0.0 <= report["r2"] <= 1.0


def test_class_names_must_exist_and_agree(data, tmp_path):
    import shutil

    from pipeline.stores.readers import ImageDbGroup
    from pipeline.training.region_init import shared_class_names

    root = tmp_path / "img"
    for name in ("coco", "vg"):
        shutil.copytree(data / "db/img" / name, root / name)
    meta = json.loads((root / "vg/meta.json").read_text())
    (root / "vg/meta.json").write_text(json.dumps({**meta, "class_names": list(np.roll(meta["class_names"], 1))}))
    with pytest.raises(ValueError, match="found 2 different lists"):
        shared_class_names(ImageDbGroup(root, ["coco", "vg"]))
    (root / "vg/meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "class_names"}))
    with pytest.raises(ValueError, match="class_names"):
        shared_class_names(ImageDbGroup(root, ["coco", "vg"]))
