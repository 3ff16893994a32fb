"""UNITER release files through the stages, on the fine-tuning test world with the tiny preset.

The known-answer path of docs/real-data.md, every line of it: pretrain -> ``uniter_ckpt export``
-> ``pretrain`` started from the file with ``steps: 0`` (its export is the file's model) ->
``finetune@vqa`` with the ``uniter_vqa_base`` preset (budget scaled down) -> each ``_run.json``
records the file's digest. Then the bad inputs: each exits with status 2 and writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.finetune_world import ROOT, ft_params, world
from pipeline.common.runinfo import file_digest

pytestmark = pytest.mark.stage  # runs pipeline stages (not in `make test-unit`)

PRETRAIN = ["pretrain.batch_tokens=400", "pretrain.val_batches=1", "pretrain.log_every=1", "pretrain.optim.lr=0.005",
            "pretrain.optim.warmup_steps=1", "pretrain.first_phase_steps=0", "pretrain.val_every=0"]
VQA = "finetune.per_task.vqa={preset: uniter_vqa_base, steps: 2, batch_tokens: 600, warmup_steps: 1}"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The world, its own pretraining (``own``, 4 steps) and that model exported as a release file."""
    from pipeline.pretrain.pretrain import run
    from pipeline.pretrain.uniter_ckpt_cli import main

    data = world(tmp_path_factory)
    run(ft_params(data, *PRETRAIN, "pretrain.steps=4", "pretrain.out_name=own"))
    out = data / "release" / "uniter-own.pt"
    assert main(["export", "--model", str(data / "models" / "own"), "--out", str(out)]) == 0
    return data


def _from_release(data: Path, file: Path, *overrides: str) -> list[str]:
    return [*PRETRAIN, "pretrain.steps=0", "pretrain.out_name=from_release", f"model.uniter_checkpoint={file}",
            f"model.uniter_checkpoint_sha256={file_digest(file)}", *overrides]


def test_export_writes_the_reference_names_config_and_notes(data):
    file = data / "release" / "uniter-own.pt"
    state = torch.load(file, weights_only=True)
    assert "uniter.img_embeddings.img_linear.weight" in state and "itm_output.weight" in state
    assert state["cls.predictions.decoder.weight"] is state["uniter.embeddings.word_embeddings.weight"]
    config = json.loads((data / "release" / "uniter-own.config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (32, 2)
    notes = json.loads((data / "release" / "uniter-own.export.json").read_text())
    assert notes["sha256"] == file_digest(file) and notes["model"]["region_feature_norm"] == "standardize"
    assert any("region_feature_norm=standardize" in d for d in notes["departures"])


@pytest.fixture(scope="module")
def imported(data) -> Path:
    """``data/models/from_release``: the first stage started from the exported file, 0 steps."""
    from pipeline.pretrain.pretrain import run as pretrain

    file = data / "release" / "uniter-own.pt"
    pretrain(ft_params(data, *_from_release(data, file)))
    return file


def test_known_answer_path_reimports_the_model_exactly_and_records_the_digest(data, imported, capsys):
    from safetensors.torch import load_file

    from pipeline.finetune.finetune import run as finetune
    from pipeline.pretrain.uniter_ckpt_cli import main

    file = imported
    assert main(["inspect", str(file)]) == 0
    assert f"uniter_checkpoint_sha256: {file_digest(file)}" in capsys.readouterr().out
    own, imported = (load_file(str(data / "models" / n / "model.safetensors")) for n in ("own", "from_release"))
    assert sorted(own) == sorted(imported)
    assert all(torch.equal(own[k], imported[k]) for k in own)  # export -> import: the same weights, bit for bit
    run = json.loads((data / "models" / "from_release" / "_run.json").read_text())
    assert run["uniter_checkpoint"]["sha256"] == file_digest(file)
    assert run["uniter_checkpoint"]["loaded_heads"] == ["mlm", "mrfr", "mrc", "itm"]
    record = finetune(ft_params(data, "pretrain.out_name=from_release", VQA), "vqa")["vqa"]
    assert record["steps"] == 2
    run = json.loads((data / "models" / "vqa" / "_run.json").read_text())
    assert run["uniter_checkpoint"]["sha256"] == file_digest(file)
    assert run["start_heads"] == {"used": [], "skipped": ["itm", "mlm", "mrc", "mrfr"]}
    # import -> export: the file's tensors again, bit for bit
    assert main(["export", "--model", str(data / "models" / "from_release"), "--out", str(data / "again.pt")]) == 0
    first, again = (torch.load(p, weights_only=True) for p in (file, data / "again.pt"))
    assert sorted(first) == sorted(again) and all(torch.equal(first[k], again[k]) for k in first)


def test_vcr_second_stage_starts_from_the_imported_file(data, imported):
    from safetensors.torch import load_file

    from pipeline.pretrain.pretrain import run_vcr

    run_vcr(ft_params(data, *_from_release(data, imported), "pretrain.vcr.steps=2", "pretrain.vcr.warmup_steps=1"))
    run = json.loads((data / "models" / "from_release_vcr" / "_run.json").read_text())
    assert run["input_digests"]["init"] is not None
    start = load_file(str(data / "models" / "from_release" / "model.safetensors"))
    vcr = load_file(str(data / "models" / "from_release_vcr" / "model.safetensors"))
    assert vcr["uniter.embeddings.token_type_embeddings.weight"].shape[0] == 4  # UNITER's VCR segment types
    moved = [k for k in start if k in vcr and start[k].shape == vcr[k].shape and not torch.equal(start[k], vcr[k])]
    assert moved  # it trained from that start


def _cli(data: Path, *sets: str) -> int:
    from pipeline.__main__ import main

    return main(["pretrain", "--params", str(ROOT / "params.yaml"), "--set", f"paths.data={data}",
                 *[a for s in ("model.preset=tiny", "model.init_from_bert=false", "finetune.compare_scratch=false",
                               "build_dbs.vqa_min_answer_count=1", "build_dbs.max_txt_len_vcr=100", *sets)
                   for a in ("--set", s)]])


def _variant(data: Path, name: str, edit) -> Path:
    state = torch.load(data / "release" / "uniter-own.pt", weights_only=True)
    out = data / "bad" / name
    out.parent.mkdir(exist_ok=True)
    torch.save(edit(dict(state)), out)
    return out


def _without_itm(s):
    return {k: v for k, v in s.items() if not k.startswith("itm_output.")}


def _more_words(s):
    words = s["uniter.embeddings.word_embeddings.weight"]
    return {**s, "uniter.embeddings.word_embeddings.weight": torch.cat([words, words[:1]]),
            "cls.predictions.decoder.weight": torch.cat([words, words[:1]])}


class _Payload:
    def __reduce__(self):
        return (print, ("payload ran",))


@pytest.mark.parametrize("name, edit, sets, message", [
    ("list.pt", lambda s: list(s.values()), (), "not a state dict"),
    ("no_itm.pt", _without_itm, (), "head itm (itm_output.*): missing, and this run needs it"),
    ("words.pt", _more_words, (), "word embeddings have"),
    ("payload.pt", lambda s: {**s, "x": _Payload()}, (), "refused to load as unsafe"),
    ("ok.pt", lambda s: s, ("model.preset=small",), "but model.preset is small (384 x 6): set model.preset=tiny"),
    ("noted.pt", lambda s: s, (), "trained with region_feature_norm=standardize (its export notes)"),
])
def test_bad_input_exits_2_names_the_file_and_writes_nothing(data, capsys, name, edit, sets, message):
    file = _variant(data, name, edit)
    if name == "noted.pt":  # its notes say how the model computed
        (data / "bad" / "noted.export.json").write_text(
            (data / "release" / "uniter-own.export.json").read_text().replace(
                file_digest(data / "release" / "uniter-own.pt"), file_digest(file)))
    # without notes a file is taken for the authors' (UNITER's forward: no feature standardisation)
    code = _cli(data, *_from_release(data, file, "pretrain.out_name=bad", "model.region_feature_norm=none", *sets))
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and str(file) in err, err
    assert "payload ran" not in capsys.readouterr().out
    assert not any((data / d / "bad").exists() for d in ("models", "metrics", "checkpoints"))


def test_a_changed_file_is_refused_against_its_pin(data, capsys):
    file = _variant(data, "changed.pt", lambda s: s)
    pinned = _from_release(data, file, "pretrain.out_name=bad", "model.region_feature_norm=none")
    torch.save({**torch.load(file, weights_only=True), "itm_output.bias": torch.ones(2)}, file)
    assert _cli(data, *pinned) == 2
    assert "but model.uniter_checkpoint_sha256 pins" in capsys.readouterr().err
    assert not (data / "models" / "bad").exists()


def test_export_refuses_a_fine_tuned_model_and_writes_nothing(data, capsys, tmp_path):
    from pipeline.pretrain.uniter_ckpt_cli import main
    from pipeline.training.model_io import CONFIG_FILE, MODEL_FILE

    task_dir = tmp_path / "vqa"
    task_dir.mkdir()
    (task_dir / CONFIG_FILE).write_text(json.dumps({"task": "vqa", "uniter_config": {}}))
    (task_dir / MODEL_FILE).write_bytes((data / "models" / "own" / MODEL_FILE).read_bytes())
    assert main(["export", "--model", str(task_dir), "--out", str(tmp_path / "x.pt")]) == 2
    assert "not a pretraining export" in capsys.readouterr().err
    assert not list(tmp_path.glob("x*"))
