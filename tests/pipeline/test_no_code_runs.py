"""Nothing the pipeline loads can run code: a pickle payload planted in every kind of file it
reads (resume checkpoints, DeepSpeed's model and ZeRO optimizer states, detector weights in both
formats, BERT weights, the RefCOCO refs pickle, LMDB values of our stores and of UNITER's release)
is refused, and the payload never runs.

The payload is an object whose unpickling opens a sentinel file for writing (what a malicious file
would do, harmlessly): the sentinel must not exist afterwards. Each file is planted the way an
attacker would: the real file, loaded and saved again with one more entry.
"""

from __future__ import annotations

import io
import pickle
import shutil
import sys
from pathlib import Path

import lz4.block
import msgpack
import numpy as np
import pytest
import torch

from model.bert_init import read_bert_state
from model.weights_file import UnsafeCheckpointError
from pipeline.extract.detector.checkpoint import CheckpointError, read_state
from pipeline.common.plain_pickle import UnsafePickleError, load_plain_pickle
from pipeline.stores.lmdb_store import encode_value
from pipeline.stores.readers import LmdbReader
from pipeline.stores.uniter_release.formats import UnsafeEntryError, decode_image_entry, decode_text_entry
from helpers.stores import write_lmdb

TRAINING_TESTS = Path(__file__).resolve().parent / "training"


class Payload:
    """Unpickling this opens ``path`` for writing: proof that the file ran code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.fixture
def sentinel(tmp_path):
    path = tmp_path / "payload_ran"
    yield path
    assert not path.exists(), "the planted payload ran"


def plant_torch(path: Path, sentinel: Path) -> None:
    """Add the payload to the torch file ``path`` (ours: loaded with our own allow-list)."""
    from pipeline.training.checkpointing import checkpoint_globals

    with torch.serialization.safe_globals(list(checkpoint_globals())):
        state = torch.load(path, map_location="cpu", weights_only=True)
    state["trigger"] = Payload(sentinel)
    torch.save(state, path)


# ---------------------------------------------------------------------------------------------
# resume checkpoints and DeepSpeed's states: a real (toy) DeepSpeed run, killed after a checkpoint


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory, toy_module):
    """A toy run of 8 steps killed during step 6: ``ckpt/step_0000004`` is complete (ZeRO 2)."""
    toy, run_toy, crash = toy_module
    out = tmp_path_factory.mktemp("crashed")
    with pytest.raises(crash):
        run_toy(toy, out, total=8, crash_after=10)
    assert (out / "ckpt" / "step_0000004" / "COMPLETE").exists()
    return out


@pytest.fixture(scope="module")
def toy_module():
    sys.path.insert(0, str(TRAINING_TESTS))
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_toy_conftest", TRAINING_TESTS / "conftest.py")
        conftest = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(conftest)
        from test_loop import Crash, run_toy
    finally:
        sys.path.remove(str(TRAINING_TESTS))
    from types import SimpleNamespace

    toy = SimpleNamespace(Model=conftest.ToyPretrainer, Dataset=conftest.ToyDataset,
                          Sampler=conftest.ToyBucketSampler, collate=conftest.toy_collate)
    return toy, run_toy, Crash


@pytest.mark.stage
@pytest.mark.parametrize("name", ["trainer_state_rank0.pt", "mp_rank_00_model_states.pt",
                                  "zero_pp_rank_0_mp_rank_00_optim_states.pt"])
def test_a_payload_in_a_resume_checkpoint_is_refused_on_resume(crashed_run, toy_module, tmp_path, sentinel, name):
    toy, run_toy, _ = toy_module
    out = tmp_path / "run"
    shutil.copytree(crashed_run, out)
    planted = out / "ckpt" / "step_0000004" / name
    plant_torch(planted, sentinel)
    with pytest.raises(UnsafeCheckpointError) as info:
        run_toy(toy, out, total=8)
    assert str(info.value).startswith(f"{planted}: refused to load as unsafe: ")
    assert "(it names io.open)" in str(info.value)


@pytest.mark.stage
def test_an_unplanted_checkpoint_still_resumes(crashed_run, toy_module, tmp_path):
    toy, run_toy, _ = toy_module
    shutil.copytree(crashed_run, tmp_path / "run")
    _, result = run_toy(toy, tmp_path / "run", total=8)
    assert result.start_step == 4


@pytest.mark.stage
def test_a_payload_in_the_optimizer_states_is_refused_by_the_export(crashed_run, tmp_path, sentinel):
    """The ZeRO export merges the fp32 weights from the saved optimizer states (zero_to_fp32)."""
    from pipeline.training.checkpointing import consolidated_state_dict

    root = tmp_path / "ckpt"
    shutil.copytree(crashed_run / "ckpt", root)
    planted = root / "step_0000004" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    plant_torch(planted, sentinel)

    class Engine:  # consolidated_state_dict reads the module's keys; the weights come from the files
        module = torch.nn.Linear(2, 2)

    with pytest.raises(UnsafeCheckpointError, match=f"^{planted}: refused to load as unsafe: .*io.open"):
        consolidated_state_dict(Engine(), root, 4, zero_stage=2)


def test_deepspeed_loads_in_a_stage_process_are_weights_only(tmp_path, sentinel):
    """DeepSpeed's loaders ask torch for weights_only=False; inside the guard they get True."""
    from pipeline.training.checkpointing import weights_only_loads

    path = tmp_path / "state.pt"
    torch.save({"w": torch.ones(2), "trigger": Payload(sentinel)}, path)
    with weights_only_loads(), pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=False)


# ---------------------------------------------------------------------------------------------
# weights and sources


def test_a_payload_in_detector_weights_is_refused(tmp_path, sentinel):
    pth = tmp_path / "detector.pth"
    torch.save({"model": {"w": torch.zeros(2)}, "meta": {"preset": "mini"}}, pth)
    plant_torch(pth, sentinel)
    with pytest.raises(UnsafeCheckpointError):
        read_state(pth)
    pkl = tmp_path / "detector.pkl"  # the caffe-converted layout: a python-2 style pickle of arrays
    pkl.write_bytes(pickle.dumps({"model": {"w": np.zeros(2, np.float32), "x": Payload(sentinel)}}, protocol=2))
    with pytest.raises(CheckpointError, match="io.open, which is not allowed"):
        read_state(pkl)


def test_a_payload_in_bert_weights_is_refused(tmp_path, sentinel):
    path = tmp_path / "pytorch_model.bin"
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(4, 2)}, path)
    plant_torch(path, sentinel)
    with pytest.raises(UnsafeCheckpointError):
        read_bert_state(path)


def test_a_payload_in_the_refcoco_refs_pickle_is_refused(tmp_path, sentinel):
    path = tmp_path / "refs(unc).p"
    path.write_bytes(pickle.dumps([{"ref_id": 1, "sentences": [Payload(sentinel)]}], protocol=2))
    with pytest.raises(UnsafePickleError):
        load_plain_pickle(path)


# ---------------------------------------------------------------------------------------------
# LMDB values


def _payload_values(sentinel: Path) -> dict[str, bytes]:
    pickled = pickle.dumps(Payload(sentinel))
    return {
        "a_raw_pickle": pickled,
        "b_lz4_pickle": lz4.block.compress(pickled, store_size=True),
        "c_zstd_pickle": __import__("zstandard").ZstdCompressor().compress(pickled),
        "d_object_array": lz4.block.compress(msgpack.packb({"x": {"data": pickled, "dtype": "|O", "shape": [1]}}),
                                             store_size=True),
        "e_ext_type": lz4.block.compress(msgpack.packb(msgpack.ExtType(1, pickled)), store_size=True),
        "f_plain": encode_value({"ok": np.arange(3, dtype=np.float16)}),
    }


def test_a_payload_in_an_lmdb_value_never_runs(tmp_path, sentinel):
    values = _payload_values(sentinel)
    write_lmdb(tmp_path / "db", sorted(values.items()), commit_every=10)
    reader = LmdbReader(tmp_path / "db")
    for key in sorted(values):
        try:
            value = reader.get(key)
        except Exception:  # noqa: BLE001 - refused is fine; running is not
            continue
        assert key in ("e_ext_type", "f_plain"), f"{key} decoded to {value!r}"
    assert reader.get("f_plain")["ok"].tolist() == [0, 1, 2]


def test_a_payload_in_a_uniter_release_entry_is_refused(tmp_path, sentinel):
    db = tmp_path / "img_db"
    array = {b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": pickle.dumps([Payload(sentinel)])}
    with pytest.raises(UnsafeEntryError):
        decode_image_entry(msgpack.packb({"conf": array}), compressed=False, db=db, key="k")
    buf = io.BytesIO()
    np.savez(buf, conf=np.array([Payload(sentinel)], dtype=object))
    with pytest.raises(UnsafeEntryError):
        decode_image_entry(buf.getvalue(), compressed=True, db=db, key="k")
    import lz4.frame

    with pytest.raises(UnsafeEntryError):
        decode_text_entry(lz4.frame.compress(msgpack.packb({"input_ids": array})), db=db, key="k")


def test_the_stage_entry_makes_every_torch_load_weights_only(monkeypatch, tmp_path, sentinel):
    """A stage process (and the ranks it launches) loads weights-only whatever a library asks."""
    from pipeline.__main__ import main

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    assert main([]) == 0  # prints the help
    path = tmp_path / "state.pt"
    torch.save({"trigger": Payload(sentinel)}, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=False)
