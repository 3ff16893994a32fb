"""docs/real-data.md "Partial set-ups, as run": each set-up's params block and commands, read from the
doc and run as written on the hand-written real-format fixtures laid out at the doc's paths."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers.source_fixtures import FIXTURES, fixture_overrides, write_shard

from pipeline.__main__ import main
from pipeline.ingest.sources.web_images import url_key

pytestmark = pytest.mark.stage  # runs pipeline stages

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "real-data.md"
SET_UPS = ("Only CC", "Only UNITER's release", "COCO + VG", "All ten")
NOT_RUN = ("pretrain",)  # it needs model.bert_checkpoint's BERT (the doc says so)


def set_up(title: str) -> tuple[dict, list[list[str]]]:
    """(params block, command lines) of one set-up of the doc."""
    text = DOC.read_text().split("## Partial set-ups, as run", 1)[1]
    body = text.split(f"### {title}\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", body, re.S).group(1)
    commands = re.search(r"```bash\n(.*?)```", body, re.S).group(1)
    lines = [shlex.split(line, comments=True) for line in commands.splitlines()]
    return yaml.safe_load(block), [line for line in lines if line]


def _merge(base: dict, changes: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _rebase(node, roots: dict[str, Path]):
    if isinstance(node, dict):
        return {k: _rebase(v, roots) for k, v in node.items()}
    if isinstance(node, str):
        for prefix, root in roots.items():
            if node.startswith(prefix):
                return str(root / node[len(prefix):])
    return node


def lay_out(block: dict, roots: dict[str, Path], scratch: Path) -> None:
    """Copy the fixture file of every sources path the block names to that path; CC/SBU images as one
    finished img2dataset shard of the fixture images' URLs (a URL without an image: a 404)."""
    fixture = dict(line.split("=", 1) for line in fixture_overrides(scratch) if line.startswith("sources."))
    spec = json.loads((FIXTURES / "images.json").read_text())
    for dataset, keys in _rebase(block.get("sources", {}), roots).items():
        for key, target in keys.items():
            source = fixture.get(f"sources.{dataset}.{key}")
            if not isinstance(target, str) or source is None or source == "null":
                continue
            target, source = Path(target), Path(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
        if dataset in ("cc", "sbu"):
            root = Path(keys["image_root"])
            urls = [name.split("/url:", 1)[1] for name in spec if name.startswith(f"{dataset}/url:")]
            write_shard(root, 0, [(u, "success", None) if (root / f"{url_key(u)}.jpg").exists()
                                  else (u, "failed_to_download", "HTTP Error 404: Not Found") for u in urls])


def write_release(block: dict, roots: dict[str, Path]) -> None:
    """A small release (a COCO image DB, a pretraining and a VQA text DB) in UNITER's formats at the
    block's root, tokenized with the block's tokenizer (written there from the default vocabulary)."""
    spec = importlib.util.spec_from_file_location(
        "release_writers", REPO / "tests" / "pipeline" / "stores" / "test_import_uniter_db.py")
    writers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writers)
    from pipeline.stores.tokenization import WordPieceTokenizer

    dbs = _rebase(block["build_dbs"], roots)
    vocab = Path(dbs["tokenizer"])
    vocab.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(WordPieceTokenizer().path, vocab)
    tok = WordPieceTokenizer(vocab)
    root = Path(dbs["uniter_release"]["root"])
    name = writers.coco("val2014", 3)
    writers.write_img_db(root, "coco_val2014", {name: writers.regions(np.random.default_rng(0), 10)},
                         compressed=True, nbb={name: 10})
    writers.write_txt_db(root, "pretrain_coco_val", {"1": {"input_ids": [2000, 2001], "img_fname": name}}, tok)
    writers.write_txt_db(root, "vqa_devval", {"7": {"input_ids": [2002], "img_fname": name,
                                                    "target": {"labels": [1], "scores": [1.0]}}}, tok)
    Path(dbs["uniter_release"]["ans2label"]).write_text(json.dumps({"yes": 0, "no": 1}))


@pytest.mark.parametrize("title", SET_UPS)
def test_the_set_up_runs_as_written(title, tmp_path):
    block, commands = set_up(title)
    roots = {"/datasets/": tmp_path / "datasets", "/weights/": tmp_path / "weights"}
    lay_out(block, roots, tmp_path / "scratch")
    if "build_dbs" in block:
        write_release(block, roots)
    params = _merge(yaml.safe_load((REPO / "params.yaml").read_text()), _rebase(block, roots))
    params["paths"]["data"] = str(tmp_path / "data")
    if "extract" in block:  # a random mini detector in place of the bottom-up-attention weights (as the doc says)
        from helpers.scene_kit import save_mini_checkpoint

        params["extract"].update(detector="mini", weights=str(save_mini_checkpoint(tmp_path / "detector.pth")),
                                 device="cpu", workers=1)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    ran = []
    for argv in commands:
        assert argv[:3] == ["python", "-m", "pipeline"], argv
        if argv[3] in NOT_RUN:
            continue
        if argv[3] == "download" and shutil.which(params["sources"]["download"]["command"]) is None:
            continue  # img2dataset is not installed: lay_out wrote its output
        assert main([*argv[3:], "--params", str(path)]) == 0, f"{title}: {shlex.join(argv)}"
        ran.append(argv[3])
    assert ran and ran[-1] in ("ingest", "import_uniter_db", "decontaminate", "build_dbs")
    if title == "COCO + VG":  # UNITER's in-domain pretraining DBs, from COCO and VG alone
        txt = tmp_path / "data" / "db" / "txt"
        for split in ("train", "val"):
            meta = json.loads((txt / f"pretrain_indomain_{split}" / "meta.json").read_text())
            assert meta["datasets"] == ["coco", "vg"] and meta["num_examples"] > 0, meta
        assert sorted(p.name for p in txt.iterdir() if p.name.startswith("pretrain_")) == \
            ["pretrain_indomain_train", "pretrain_indomain_val"]
