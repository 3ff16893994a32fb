"""Decontamination from raw files in their real formats: eval images whose own eval rows carry a COCO
id and nothing else (RefCOCO+ val/testA/testB, VQA test) reached by CC rows at COCO-URL variants and
SBU rows at other Flickr URLs of the same photo; look-alikes (other ids, non-eval images) are kept.

Everything runs through ingest (the real readers) and the decontaminate stage; images are not
checked or hashed (``check_images``/``near_duplicates`` off), so only identity keys can match.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from pipeline.decontam import decontaminate
from pipeline.ingest import ingest
from pipeline.params.parser import load_params

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

REPO = Path(__file__).resolve().parents[3]
PID = {11: 5000000011, 12: 5000000012, 13: 5000000013}  # Flickr photo ids of the COCO train2014 images
COCO = "http://images.cocodataset.org/{split}/COCO_{split}_{id:012d}.jpg"


def _coco_image(cid: int, split: str = "train2014") -> dict:
    image = {"license": 1, "file_name": f"COCO_{split}_{cid:012d}.jpg", "coco_url": COCO.format(split=split, id=cid),
             "height": 480, "width": 640, "date_captured": "2013-11-14 11:18:45", "id": cid}
    if cid in PID:
        image["flickr_url"] = f"http://farm4.staticflickr.com/1004/{PID[cid]}_9f2c4e1b7a_z.jpg"
    return image


def _write(root: Path) -> dict[str, dict[str, Path]]:
    """Real-format COCO, Karpathy, RefCOCO+, VQA, COCO test list, VG, CC and SBU files; their sources."""
    def dump(rel: str, obj) -> Path:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj))
        return path

    train = [_coco_image(c) for c in (11, 12, 13)]
    caps = {"info": {}, "licenses": [], "images": train,
            "annotations": [{"id": 100 + c, "image_id": c, "caption": f"picture {c}"} for c in (11, 12, 13)]}
    val = {"info": {}, "licenses": [], "images": [_coco_image(21, "val2014")],
           "annotations": [{"id": 121, "image_id": 21, "caption": "a Karpathy test picture"}]}
    karpathy = {"dataset": "coco", "images": [
        {"cocoid": c, "filepath": "train2014" if c < 20 else "val2014", "filename": f"x{c}.jpg", "imgid": i,
         "split": "train" if c < 20 else "test", "sentences": [{"raw": "x", "tokens": ["x"], "sentid": i}],
         "sentids": [i]} for i, c in enumerate((11, 12, 13, 21))]}
    instances = {"info": {}, "licenses": [], "images": train, "categories": [{"id": 1, "name": "person"}],
                 "annotations": [{"id": 1000 + c, "image_id": c, "bbox": [1.0, 2.0, 30.0, 40.0], "category_id": 1,
                                  "area": 1200.0, "iscrowd": 0} for c in (11, 12, 13)]}
    refs = [{"ref_id": i, "ann_id": 1000 + c, "image_id": c, "split": split, "category_id": 1,
             "file_name": f"COCO_train2014_{c:012d}_{1000 + c}.jpg", "sent_ids": [i],
             "sentences": [{"sent_id": i, "sent": f"the person {c}", "raw": f"the person {c}", "tokens": []}]}
            for i, (c, split) in enumerate(((11, "val"), (12, "testA"), (13, "train")))]
    (root / "refcoco+").mkdir(parents=True)
    (root / "refcoco+/refs(unc).p").write_bytes(pickle.dumps(refs, protocol=2))
    # real VQA test questions carry an image id only; COCO's test list has the URL (and no flickr_url)
    questions = lambda subtype, qs: {"info": {}, "task_type": "Open-Ended", "data_type": "mscoco",  # noqa: E731
                                     "license": {}, "data_subtype": subtype, "questions": qs}
    answers = [{"answer": "yes", "answer_confidence": "yes", "answer_id": k + 1} for k in range(10)]
    test_info = {"info": {}, "licenses": [], "categories": [], "images": [
        {k: v for k, v in _coco_image(c, "test2015").items() if k != "flickr_url"} for c in (9001, 9002)]}
    vg = [{"image_id": 101, "coco_id": 12, "flickr_id": PID[12], "width": 640, "height": 480,
           "url": "https://cs.stanford.edu/people/rak248/VG_100K/101.jpg"},
          {"image_id": 102, "coco_id": 13, "flickr_id": PID[13], "width": 640, "height": 480,
           "url": "https://cs.stanford.edu/people/rak248/VG_100K/102.jpg"}]
    regions = [{"id": i, "regions": [{"region_id": i * 10, "image_id": i, "phrase": "a person", "x": 1, "y": 2,
                                      "width": 30, "height": 40}]} for i in (101, 102)]
    cc_urls = [
        "http://Images.CocoDataset.ORG/train2014/COCO_train2014_000000000011.jpg",  # RefCOCO+ val 11
        "http://images.cocodataset.org:80/train2014/COCO_train2014_000000000012.jpg",  # RefCOCO+ testA 12
        "http://images.cocodataset.org/train2014/./COCO_train2014_000000000011.jpg#main",  # RefCOCO+ val 11
        "http://images.cocodataset.org/./test2015/COCO_test2015_000000009001.jpg",  # VQA test 9001
        "http://images.cocodataset.org/test2015/COCO_test2015_000000009001.jpg#x",  # VQA test 9001
        "HTTPS://CS.STANFORD.EDU:443/people/rak248/VG_100K/101.jpg",  # VG's copy of RefCOCO+ 12
        "http://IMAGES.cocodataset.org/train2014/COCO_train2014_000000000013.jpg",  # look-alike: RefCOCO+ train
        "http://images.cocodataset.org/test2015/COCO_test2015_000000009002.jpg",  # look-alike: no VQA question
        "http://images.cocodataset.org/train2014/COCO_train2014_000000000111.jpg",  # look-alike: id 111
    ]
    sbu_urls = [
        f"https://live.staticflickr.com/65535/{PID[11]}_0d1e2f3a4b_o.jpg",  # RefCOCO+ val 11, re-served
        f"https://farm9.static.flickr.com/77/{PID[12]}_c0ffee1234_b.jpg",  # RefCOCO+ testA 12
        f"https://live.staticflickr.com/65535/{PID[13]}_0d1e2f3a4b_o.jpg",  # look-alike: RefCOCO+ train
        f"https://live.staticflickr.com/65535/{PID[11] + 100}_0d1e2f3a4b_o.jpg",  # look-alike: another photo
    ]
    (root / "cc").mkdir()
    (root / "cc/train.tsv").write_text("".join(f"caption {i}\t{u}\n" for i, u in enumerate(cc_urls)))
    (root / "cc/val.tsv").write_text("a validation caption\thttps://example.org/val.jpg\n")
    (root / "sbu").mkdir()
    (root / "sbu/urls.txt").write_text("".join(u + "\n" for u in sbu_urls))
    (root / "sbu/captions.txt").write_text("".join(f"sbu caption {i}\n" for i in range(len(sbu_urls))))
    images = root / "images"
    return {
        "coco": {"captions_train": dump("coco/captions_train2014.json", caps),
                 "captions_val": dump("coco/captions_val2014.json", val),
                 "instances_train": root / "coco/captions_train2014.json",
                 "instances_val": root / "coco/captions_val2014.json",
                 "karpathy": dump("coco/dataset_coco.json", karpathy), "image_root": images / "coco",
                 "image_info_test": dump("coco/image_info_test2015.json", test_info)},
        "refcoco": {"refs": root / "refcoco+/refs(unc).p", "instances": dump("refcoco+/instances.json", instances)},
        "vqa": {"questions_train": dump("vqa/q_train.json", questions("train2014", [
                    {"image_id": 13, "question": "Is it a person?", "question_id": 13000}])),
                "questions_val": dump("vqa/q_val.json", questions("val2014", [])),
                "questions_test": dump("vqa/q_test.json", questions("test2015", [
                    {"image_id": 9001, "question": "What is it?", "question_id": 9001000}])),
                "annotations_train": dump("vqa/a_train.json", {"annotations": [
                    {"question_id": 13000, "image_id": 13, "answers": answers, "multiple_choice_answer": "yes",
                     "answer_type": "yes/no", "question_type": "is it"}]}),
                "annotations_val": dump("vqa/a_val.json", {"annotations": []})},
        "vg": {"image_data": dump("vg/image_data.json", vg),
               "region_descriptions": dump("vg/region_descriptions.json", regions), "image_root": images / "vg"},
        # no image files (check_images is off): the sha1 layout names a path without looking one up
        "cc": {"train_tsv": root / "cc/train.tsv", "val_tsv": root / "cc/val.tsv", "image_root": images / "cc",
               "image_layout": "sha1"},
        "sbu": {"urls": root / "sbu/urls.txt", "captions": root / "sbu/captions.txt", "image_root": images / "sbu",
                "image_layout": "sha1"},
    }


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("real_formats")
    sources = _write(root)
    sets = [f"sources.{ds}.{k}={v}" for ds, keys in sources.items() for k, v in keys.items()] + [
        f"paths.data={root / 'data'}", "ingest.datasets=[coco, vg, cc, sbu, vqa, refcoco]", "finetune.tasks=[vqa, refcoco_plus]",
        "ingest.check_images=false", "decontaminate.near_duplicates=false", "decontaminate.workers=1",
        "decontaminate.eval_splits={coco: [test], refcoco: [val, testA, testB], vqa: [test]}",
        "decontaminate.pretrain_datasets=[coco, vg, cc, sbu]", "sources.vqa.annotations_test=null"]
    params = load_params(REPO / "params.yaml", sets)
    ingest.run(params)
    return decontaminate.run(params)


def _removed(reports: dict, dataset: str) -> dict[str, tuple[str, list[str]]]:
    return {e["url"]: (e["reason"], e["matched_eval"]) for e in reports[dataset]["removed"]}


def test_cc_rows_at_coco_url_variants_of_refcoco_and_vqa_test_images_are_removed(reports):
    assert _removed(reports, "cc") == {
        "http://Images.CocoDataset.ORG/train2014/COCO_train2014_000000000011.jpg": ("canonical_url", ["refcoco/val/11"]),
        "http://images.cocodataset.org:80/train2014/COCO_train2014_000000000012.jpg":
            ("canonical_url", ["refcoco/testA/12"]),
        "http://images.cocodataset.org/train2014/./COCO_train2014_000000000011.jpg#main":
            ("canonical_url", ["refcoco/val/11"]),
        "http://images.cocodataset.org/./test2015/COCO_test2015_000000009001.jpg": ("canonical_url", ["vqa/test/9001"]),
        "http://images.cocodataset.org/test2015/COCO_test2015_000000009001.jpg#x": ("canonical_url", ["vqa/test/9001"]),
        "HTTPS://CS.STANFORD.EDU:443/people/rak248/VG_100K/101.jpg": ("canonical_url", ["refcoco/testA/12"]),
    }
    assert reports["cc"]["kept_rows"] == 3 + 1  # the three look-alikes and the validation row


def test_sbu_rows_at_other_flickr_urls_of_refcoco_photos_are_removed(reports):
    assert _removed(reports, "sbu") == {
        f"https://live.staticflickr.com/65535/{PID[11]}_0d1e2f3a4b_o.jpg": ("flickr_photo_id", ["refcoco/val/11"]),
        f"https://farm9.static.flickr.com/77/{PID[12]}_c0ffee1234_b.jpg": ("flickr_photo_id", ["refcoco/testA/12"]),
    }
    assert reports["sbu"]["kept_rows"] == 2  # the look-alikes


def test_coco_and_vg_removals_are_the_eval_images_themselves_and_vgs_copy(reports):
    assert {e["image_id"]: (e["reason"], e["matched_eval"]) for e in reports["coco"]["removed"]} == {
        "11": ("eval_split", ["refcoco/val/11"]), "12": ("eval_split", ["refcoco/testA/12"]),
        "21": ("eval_split", ["coco/test/21"])}
    assert {e["image_id"]: (e["reason"], e["matched_eval"]) for e in reports["vg"]["removed"]} == {
        "101": ("coco_id", ["refcoco/testA/12"])}
