"""Hugging Face ids for model.bert_checkpoint and build_dbs.tokenizer, resolved offline through a hub
cache laid out as huggingface_hub lays it out (blobs/, snapshots/<commit>/ links, refs/main),
filled with the real BERT files of the shipped MiniLM checkpoint."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from pipeline.common import hf_cache

REPO = Path(__file__).resolve().parents[3]
HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # the hub's name of the shipped checkpoint
COMMIT = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
FILES = ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json")


def fill_cache(cache: Path, repo_id: str, files: dict[str, Path]) -> Path:
    """``cache/models--<org>--<name>`` as the hub client writes it; returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for name, src in files.items():
        blob = hashlib.sha256(src.read_bytes()).hexdigest()
        shutil.copyfile(src, repo / "blobs" / blob)
        os.symlink(Path("../../blobs") / blob, snap / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An offline hub cache in tmp holding HUB_ID; HF_HUB_CACHE points at it."""
    from model.bert_init import default_bert_checkpoint

    shipped = default_bert_checkpoint().parent
    cache = tmp_path / "hub"
    snap = fill_cache(cache, HUB_ID, {name: shipped / name for name in FILES})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache, snap


def test_a_cached_id_gives_the_snapshot_files_and_the_same_weights(hub):
    from huggingface_hub import scan_cache_dir

    from model.bert_init import default_bert_checkpoint, read_bert_state

    cache, snap = hub
    info = scan_cache_dir(cache)  # the hub client's own reading of the folder
    assert [(r.repo_id, [rev.commit_hash for rev in r.revisions]) for r in info.repos] == [(HUB_ID, [COMMIT])]
    path = hf_cache.resolve_bert_checkpoint(HUB_ID)
    assert path == snap / "model.safetensors"
    ours, shipped = read_bert_state(path), read_bert_state(default_bert_checkpoint())
    assert ours.keys() == shipped.keys() and all((ours[k] == shipped[k]).all() for k in ours)


def test_transformers_reads_the_same_cache(hub):
    """An independent reader: transformers' from_pretrained, offline, finds the id in that cache."""
    transformers = pytest.importorskip("transformers")
    cache, _ = hub
    config = transformers.AutoConfig.from_pretrained(HUB_ID, cache_dir=str(cache), local_files_only=True)
    assert config.hidden_size == 384


def test_the_tokenizer_takes_an_id_and_records_it(hub):
    from pipeline.stores.tokenization import WordPieceTokenizer

    by_id, shipped = WordPieceTokenizer(HUB_ID), WordPieceTokenizer(None)
    assert by_id.name == HUB_ID and by_id.path == hub[1] / "vocab.txt"
    assert by_id.digest == shipped.digest and by_id.vocab_size == shipped.vocab_size == 30522
    text = "A man rides a Horse near the beach."
    assert by_id.encode(text) == shipped.encode(text)


def test_params_accept_a_cached_id_and_keep_it(hub):
    from pipeline.params.parser import load_params

    params = load_params(REPO / "params.yaml", [f"model.bert_checkpoint={HUB_ID}", f"build_dbs.tokenizer={HUB_ID}"])
    assert str(params.model.bert_checkpoint) == HUB_ID and str(params.build_dbs.tokenizer) == HUB_ID


def test_an_uncached_id_offline_names_the_id_the_folder_and_the_fetch(hub):
    from pipeline.params.parser import ParamsError, load_params

    cache, _ = hub
    with pytest.raises(ParamsError) as err:
        load_params(REPO / "params.yaml", ["model.bert_checkpoint=bert-base-uncased"])
    text = str(err.value)
    assert "model.bert_checkpoint: 'bert-base-uncased' is neither a path nor a Hugging Face id" in text
    assert f"looked in {cache / 'models--bert-base-uncased'}" in text
    assert "hf download bert-base-uncased model.safetensors" in text
    with pytest.raises(hf_cache.NotCached, match="build_dbs.tokenizer: 'google-bert/bert-base-uncased'.*"
                                                 "hf download google-bert/bert-base-uncased vocab.txt"):
        from pipeline.stores.tokenization import WordPieceTokenizer

        WordPieceTokenizer("google-bert/bert-base-uncased")


def test_a_snapshot_without_weights_is_refused(hub, tmp_path):
    cache, _ = hub
    fill_cache(cache, "org/tokenizer-only", {"vocab.txt": hub[1] / "vocab.txt"})
    with pytest.raises(hf_cache.NotCached, match=r"snapshot of 'org/tokenizer-only' .* has none of "
                                                 r"\['model.safetensors', 'pytorch_model.bin'\]"):
        hf_cache.resolve_bert_checkpoint("org/tokenizer-only")
    assert hf_cache.resolve(Path("org/tokenizer-only"), hf_cache.TOKENIZER_FILES, key="k").name == "vocab.txt"


def test_a_path_stays_a_path(hub, tmp_path, monkeypatch):
    from pipeline.params.parser import ParamsError, load_params

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bert-base-uncased").mkdir()  # a local folder shadows the id of the same name
    assert hf_cache.resolve_bert_checkpoint("bert-base-uncased") == Path("bert-base-uncased")
    for value in ("weights/bert.safetensors", "./bert", "/abs/bert", "~/bert", "../bert", "a/b/c"):
        assert not hf_cache.is_hub_id(value), value
    assert hf_cache.resolve_bert_checkpoint(None) is None
    with pytest.raises(ParamsError, match="model.bert_checkpoint: path does not exist: weights/bert.safetensors"):
        load_params(REPO / "params.yaml", ["model.bert_checkpoint=weights/bert.safetensors"])
