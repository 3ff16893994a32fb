"""UNITER release files on disk (pipeline/training/uniter_ckpt.py): write, read back, refuse."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from model.config import UniterConfig
from model.pretraining import UniterForPretraining
from model.uniter_format import load_uniter_state, to_uniter
from model.weights_file import UniterFormatError, UnsafeCheckpointError
from pipeline.common.runinfo import file_digest
from pipeline.training.uniter_ckpt import notes_path, read_release, write_release

CONFIG = UniterConfig.from_preset("tiny", vocab_size=40, region_feature_norm="standardize")
D, C = 10, 5


def _model(seed: int) -> UniterForPretraining:
    torch.manual_seed(seed)
    return UniterForPretraining(CONFIG, img_dim=D, num_classes=C)


def _meta() -> dict:
    return {"uniter_config": dataclasses.asdict(CONFIG), "img_dim": D, "num_classes": C, "wra_weight": 0.1,
            "tokenizer": {"tokenizer": "vocab.txt", "vocab_size": 40}}


def test_fp16_export_reads_back_as_fp32_and_exports_again_bit_for_bit(tmp_path):
    model = _model(0)
    out = tmp_path / "rel" / "uniter-tiny.pt"
    notes = write_release(model.state_dict(), _meta(), out, dtype=torch.float16, source="here")
    raw = torch.load(out, weights_only=True)
    assert raw["cls.predictions.decoder.weight"] is raw["uniter.embeddings.word_embeddings.weight"]  # tied: one tensor
    assert {v.dtype for v in raw.values()} == {torch.float16}
    release = read_release(out, sha256=notes["sha256"])
    assert release.dtypes == ("torch.float16",) and {v.dtype for v in release.state.values()} == {torch.float32}
    assert release.shape.preset == "tiny" and release.notes["sha256"] == file_digest(out)
    assert release.forward_settings() == {"region_feature_norm": "standardize", "region_box_norm": "none"}
    assert any("region_feature_norm=standardize" in n for n in notes["departures"])
    config = json.loads(out.with_name("uniter-tiny.config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (32, 2, 40)
    again = _model(1)
    load_uniter_state(again, release.state, needs={"mlm", "mrfr", "mrc", "itm"}, source=str(out))
    back = to_uniter(again.state_dict())
    assert all(torch.equal(back[k].half(), raw[k]) for k in raw)


def test_notes_of_another_file_are_not_trusted(tmp_path):
    out = tmp_path / "a.pt"
    write_release(_model(0).state_dict(), _meta(), out)
    torch.save(torch.load(out, weights_only=True) | {"itm_output.bias": torch.ones(2)}, out)
    assert read_release(out).notes is None  # the file changed after its notes: taken for the authors' own
    assert notes_path(out).is_file()


def test_refusals_name_the_file(tmp_path):
    pinned = tmp_path / "pinned.pt"
    write_release(_model(0).state_dict(), _meta(), pinned)
    with pytest.raises(UniterFormatError, match=r"pinned\.pt: sha256 .* but model\.uniter_checkpoint_sha256 pins"):
        read_release(pinned, sha256="0" * 64)
    cases = {"list.pt": [torch.zeros(1)], "strings.pt": {"uniter.x": "text"},
             "bert.pt": {"bert.embeddings.word_embeddings.weight": torch.zeros(2, 2)}}
    for name, content in cases.items():
        torch.save(content, tmp_path / name)
    for name, message in [("list.pt", "not a state dict"), ("strings.pt", "not a state dict of tensors"),
                          ("bert.pt", "not a UNITER checkpoint"), ("missing.pt", "no such file")]:
        with pytest.raises(UniterFormatError, match=message) as err:
            read_release(tmp_path / name)
        assert str(tmp_path / name) in str(err.value)
    for text in ("hello\n", "not a checkpoint"):  # no torch file at all: refused as such or as unsafe pickle
        (tmp_path / "text.pt").write_text(text)
        with pytest.raises((UniterFormatError, UnsafeCheckpointError), match="text.pt: (not a torch|refused)"):
            read_release(tmp_path / "text.pt")


def test_a_planted_payload_is_refused_without_running(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (marker.write_text, ("payload ran",))

    state = to_uniter(_model(0).state_dict()) | {"extra": Payload()}
    torch.save(state, tmp_path / "evil.pt")
    with pytest.raises(UnsafeCheckpointError, match="evil.pt: refused to load as unsafe"):
        read_release(tmp_path / "evil.pt")
    assert not marker.exists()
