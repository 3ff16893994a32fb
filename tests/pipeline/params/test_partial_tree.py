"""A set-up is checked against what the command runs: a real-format tree holding one dataset (CC,
as its TSVs and img2dataset's output lay it out) with params.yaml changed only to ``world: real``.

Each entry point (ingest, download, extract, build_dbs; import_uniter_db in
tests/pipeline/stores/test_import_uniter_db.py) runs, or is refused naming the key and the stage
that needs it, only for the inputs of the stages it runs.
"""

from __future__ import annotations

import pandas as pd
import pytest
from helpers.source_fixtures import partial_real_params, put_cc

from pipeline.__main__ import main
from pipeline.params.parser import ParamsError, load_params


@pytest.fixture
def only_cc(tmp_path):
    params, datasets = partial_real_params(tmp_path)
    put_cc(datasets, tmp_path / "scratch")
    return params, datasets, tmp_path / "data"


def test_ingest_of_the_one_dataset_on_disk_runs_and_another_is_refused_by_name(only_cc, capsys):
    params, datasets, data = only_cc
    assert main(["ingest", "cc", "--params", str(params)]) == 0
    manifest = pd.read_parquet(data / "manifests" / "cc.parquet")
    assert sorted(manifest.url) == ["http://example.com/img/1.jpg", "http://example.com/img/7.jpg",
                                    "http://example.com/val/1.jpg", "https://example.com/img/13.jpg?x=1"]
    rejects = pd.read_parquet(data / "manifests" / "cc.rejects.parquet")
    assert "img2dataset failed_to_download: HTTP Error 404: Not Found" in " ".join(rejects.detail)
    capsys.readouterr()
    assert main(["ingest", "coco", "--params", str(params)]) == 2
    err = capsys.readouterr().err
    assert f"sources.coco.captions_train: path does not exist: {datasets}/coco/annotations/captions_train2014.json " \
           "(needed by ingest@coco)" in err
    assert "sources.cc" not in err and "image_info_test" not in err and "sources.vg" not in err
    assert main(["ingest", "--params", str(params)]) == 2  # no ITEM: every dataset of ingest.datasets


def test_cc_without_its_validation_tsv(only_cc):
    params, datasets, data = only_cc
    (datasets / "cc" / "Validation_GCC-1.1.0-Validation.tsv").unlink()
    assert main(["ingest", "cc", "--params", str(params)]) == 2
    assert main(["ingest", "cc", "--params", str(params), "--set", "sources.cc.val_tsv=null"]) == 0
    manifest = pd.read_parquet(data / "manifests" / "cc.parquet")
    assert set(manifest.split) == {"train"} and len(manifest) == 3


def test_download_checks_the_url_lists_not_the_image_root_it_writes(only_cc, capsys):
    params, datasets, _ = only_cc
    load_params(params, ["sources.cc.image_root=/nowhere/cc"], command="download", item="cc")
    args = ["--params", str(params), "--set", "sources.download.command=/no/img2dataset"]
    assert main(["download", "cc", *args]) == 1  # past the params check: the stage's own check of the executable
    assert "sources.download.command: /no/img2dataset is not an executable" in capsys.readouterr().err
    assert main(["download", *args]) == 2  # no ITEM: cc and sbu (both in ingest.datasets)
    err = capsys.readouterr().err
    assert f"sources.sbu.urls: path does not exist: {datasets}/sbu/" in err and "(needed by download@sbu)" in err
    assert "image_root" not in err and "sources.cc" not in err


def test_extract_checks_the_image_roots_of_the_sources_it_extracts(only_cc):
    params, datasets, _ = only_cc
    for item in ("cc", "cc:1/2"):
        load_params(params, command="extract", item=item)
    with pytest.raises(ParamsError) as err:
        load_params(params, command="extract", item="coco")
    assert str(err.value).endswith(f"sources.coco.image_root: path does not exist: {datasets}/coco/images "
                                   "(needed by extract@coco)")
    with pytest.raises(ParamsError, match=r"needed by extract@vg"):
        load_params(params, command="extract")  # every source of extract.sources


def test_build_dbs_and_the_training_stages_read_no_source(only_cc):
    params, _, _ = only_cc
    for command in ("build_dbs", "import_uniter_db", "pretrain", "finetune", "results"):
        load_params(params, command=command)
    with pytest.raises(ParamsError, match=r"sources.coco.image_info_test: path does not exist.*needed by decontaminate"):
        load_params(params, command="decontaminate")
    with pytest.raises(ParamsError, match=r"needed by ingest@coco"):
        load_params(params)  # no command (Airflow's whole run): everything configured
    with pytest.raises(ParamsError, match=r"model.bert_checkpoint: path does not exist"):
        load_params(params, ["model.bert_checkpoint=/nowhere/bert"], command="pretrain")
    load_params(params, ["model.bert_checkpoint=/nowhere/bert"], command="ingest", item="cc")


def test_an_item_left_out_of_the_params_is_still_checked(only_cc):
    params, datasets, _ = only_cc
    with pytest.raises(ParamsError, match=r"sources.vg.image_data: path does not exist.*needed by ingest@vg"):
        load_params(params, ["ingest.datasets=[cc]", "finetune.tasks=[]"], command="ingest", item="vg")
    with pytest.raises(ParamsError, match=r"sources.vcr.image_root: .*needed by extract@vcr"):
        load_params(params, ["extract.sources=[cc]"], command="extract", item="vcr")
    load_params(params, command="ingest", item="no_such_dataset")  # the stage names the dataset it does not know


@pytest.mark.parametrize("key, make", [
    ("sources.cc.val_tsv", lambda cc: _replace(cc / "Validation_GCC-1.1.0-Validation.tsv", "dir")),
    ("sources.cc.image_root", lambda cc: _replace(cc / "images", "file")),
])
def test_a_path_of_the_wrong_kind_is_refused_before_any_work(only_cc, capsys, key, make):
    """A directory where a file is read (a download unpacked into a folder of the file's name) was a
    traceback; an image root that is a file made every row a missing_image with exit status 0."""
    params, datasets, data = only_cc
    path = make(datasets / "cc")
    assert main(["ingest", "cc", "--params", str(params)]) == 2
    want = "a directory, expected a file" if key.endswith("tsv") else "not a directory"
    assert f"{key}: {want}: {path} (needed by ingest@cc)" in capsys.readouterr().err
    assert not (data / "manifests").exists()


def _replace(path, kind: str):
    """Put a directory (``dir``) or an empty file (``file``) where ``path`` was."""
    import shutil

    (shutil.rmtree if path.is_dir() else path.unlink)(path)
    path.mkdir() if kind == "dir" else path.write_bytes(b"")
    return path


def test_a_stage_run_before_the_one_writing_its_input_says_so_in_one_line(only_cc, capsys):
    """``extract cc`` before train_detector (or without extract.weights) and ``build_dbs`` before
    decontaminate: their messages (docs/troubleshooting.md) came at the end of a traceback."""
    params, _, data = only_cc
    assert main(["ingest", "cc", "--params", str(params)]) == 0
    capsys.readouterr()
    assert main(["extract", "cc", "--params", str(params)]) == 1
    err = capsys.readouterr().err
    assert f"error: detector weights not found: {data}/models/detector/model_final.pth (run `python -m pipeline " \
           "train_detector`)" in err
    assert main(["build_dbs", "--params", str(params)]) == 1
    assert f"error: build_dbs: pretraining corpora without a clean manifest: coco, vg, cc, sbu ({data}/clean/coco" \
        in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["ingest", "cocoo"], "unknown dataset 'cocoo'; expected one of coco, vg,"),
    (["extract", "cocoo"], "extract: unknown item 'cocoo'; expected one of ['cc', 'coco',"),
    (["extract", "cc:3/2"], "extract: item 'cc:3/2': expected SOURCE:k/K with 1 <= k <= K"),
    (["download", "coco"], "download: no download for dataset 'coco' (one of cc, sbu)"),
    (["finetune", "vqaa"], "finetune: unknown task 'vqaa' (the ITEM of `finetune`); expected one of vqa, vcr, nlvr2, "
                           "snli_ve, retrieval_flickr, refcoco_plus"),
])
def test_an_item_the_stage_does_not_know_is_bad_input(only_cc, capsys, argv, message):
    """A misspelt ITEM was a ValueError traceback (ingest, extract, finetune) or exit status 1, the
    machine's state (download); it is a bad argument: exit status 2, one line. The stage's lock files
    (``cache/locks/<stage>@<item>.lock``, named after the bad ITEM) were made before the refusal."""
    params, _, data = only_cc
    assert main([*argv, "--params", str(params)]) == 2
    assert f"error: {message}" in capsys.readouterr().err
    assert not [p for p in data.rglob("*") if p.is_file()]  # the ITEM is checked before any lock file is made


@pytest.mark.parametrize("argv, sets, message", [
    (["ingest"], ["ingest.datasets=[]"], "ingest: ingest.datasets is empty: nothing to ingest"),
    (["download"], ["ingest.datasets=[cc]"], None),
    (["download"], ["ingest.datasets=[coco]"],
     "download: ingest.datasets names neither cc nor sbu: nothing to download"),
])
def test_a_command_left_with_nothing_to_run_says_so(only_cc, capsys, argv, sets, message):
    """``ingest`` / ``download`` without ITEM run the configured datasets; with none of them configured
    they logged "finished" and exited 0 having done nothing."""
    params, _, _ = only_cc
    args = [*argv, "--params", str(params), "--set", "finetune.tasks=[]",
            "--set", "sources.download.command=/no/img2dataset"]
    for item in sets:
        args += ["--set", item]
    if message is None:  # past the check: the stage's own check of the executable
        assert main(args) == 1 and "/no/img2dataset is not an executable" in capsys.readouterr().err
        return
    assert main(args) == 2
    assert f"error: {message}" in capsys.readouterr().err


def test_detector_weights_that_do_not_load_are_one_line_with_helper_processes(only_cc, tmp_path):
    """extract with workers: the driver reported the bad weights file in one line, then each spawned
    helper, which loads the same file, printed its own traceback ("Exception in initializer")."""
    import subprocess
    import sys

    params, _, data = only_cc
    assert main(["ingest", "cc", "--params", str(params)]) == 0
    weights = tmp_path / "faster_rcnn_from_caffe_attr.pkl"
    weights.write_bytes(b"not a pickle\n")
    sets = ["extract.detector=butd_r101", f"extract.weights={weights}", "extract.device=cpu", "extract.workers=2"]
    out = subprocess.run([sys.executable, "-m", "pipeline", "extract", "cc", "--params", str(params),
                          *(a for s in sets for a in ("--set", s))], capture_output=True, text=True, timeout=600)
    assert out.returncode == 2, out.stderr[-3000:]
    assert f"error: {weights}: not a caffe-converted detectron2 pickle" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert not (data / "features").exists()


@pytest.mark.parametrize("key, command", [("extract.weights", "extract"), ("build_dbs.tokenizer", "build_dbs")])
def test_a_directory_for_a_weights_or_vocabulary_file_is_a_params_error(only_cc, tmp_path, key, command):
    """It passed the path check (it exists), then extract said "detector weights not found" and
    build_dbs raised a FileNotFoundError traceback "tokenizer file ... does not exist"."""
    params, _, _ = only_cc
    with pytest.raises(ParamsError, match=rf"{key}: a directory, expected a file: {tmp_path}"):
        other = "extract.detector=butd_r101" if command == "extract" else "world=real"
        load_params(params, [f"{key}={tmp_path}", other], command=command, item="cc")


def test_an_ingest_that_keeps_no_row_fails_naming_the_reasons_and_the_rejects(only_cc, capsys, tmp_path):
    """Every row rejected (here: images looked up in an empty folder), or an empty source, exited 0
    with an empty manifest: a dataset with nothing kept is never what the user wants."""
    params, datasets, data = only_cc
    empty = tmp_path / "no_images"
    empty.mkdir()
    args = ["ingest", "cc", "--params", str(params), "--set", f"sources.cc.image_root={empty}",
            "--set", "sources.cc.image_layout=sha1"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    rejects = data / "manifests" / "cc.rejects.parquet"
    assert len(err) == 1 and err[0].startswith("error: ingest@cc: 0 of 17 rows kept; top reject reasons: "
                                               "missing_image 8, malformed_row 3, bad_url 2; "), err
    assert err[0].endswith(f"; every rejected row, with its reason and record: {rejects}")
    assert len(pd.read_parquet(rejects)) == 17  # the file the message names is there to read
    assert not (data / "manifests" / "cc.parquet").exists() and not (data / "manifests" / "cc._run.json").exists()

    (datasets / "cc" / "Train_GCC-training.tsv").write_bytes(b"")
    assert main(["ingest", "cc", "--params", str(params), "--set", "sources.cc.val_tsv=null"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: ingest@cc: the source holds no row (read: "
                                               f"{datasets}/cc/Train_GCC-training.tsv); check that it is the "
                                               "published file, not an empty download")
