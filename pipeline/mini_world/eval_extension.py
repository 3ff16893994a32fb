"""Eval items added after the whole world is written: ``mini_world.n_vqa_test_extra`` COCO test2015
images with their VQA questions, ``n_refcoco_test_extra`` COCO train2014 images with RefCOCO+
testA / testB refs (after ``n_refcoco_val_extra`` COCO train2014 images with RefCOCO+ val refs),
``n_vcr_test_extra`` VCR images, ``n_nlvr2_test_extra_pairs`` NLVR2 pairs and
``n_snli_ve_test_extra`` Flickr30k photos with SNLI-VE test premises and hypotheses.

The world's split plans give each task's test split ~15% of its images, too few for a gain's
95% interval to resolve 2 points (docs/decisions.md#eval-protocol: test splits are sized from the
dev intervals), and RefCOCO+'s val 12 images, too few to estimate that interval from. The extra
items are drawn here, after every other writer, from random streams of their own, and appended to the released files (and to the answers and
labels that VQA's evaluation server and VCR's leaderboard hold). So every image, row and planted
overlap written before them stays byte for byte as it was: the train splits, the pretraining data and
the other tasks' dev splits do not move. Later extensions do feel earlier ones in one way: every image
is rendered at a perceptual-hash distance from all before it (``render.PhashRegistry``), so more
RefCOCO+ images redraw the background of a few later VCR and NLVR2 test images (9 of each when
RefCOCO+'s extra images went from 120 to 614; their scenes and text stay the same).
They are eval images like the others (``World.use``), which decontamination removes wherever a
pretraining source holds them; no overlap is planted on them. RefCOCO+'s images are COCO train2014
images, in COCO's caption, instance and Karpathy files like every RefCOCO+ image: planted.json lists
them as eval images that decontamination must take out of COCO, and the cleaned COCO manifest is
the one a world without them gives, and the mini detector leaves them out of its training as it
does every RefCOCO+ val and test image (``train_detector``).
"""

from __future__ import annotations

import pickle

import numpy as np

from pipeline.mini_world.coco import TEST2015_INFO, add_coco_entries, write_test2015_image
from pipeline.mini_world.flickr30k import SNLI_VE_TEST, snli_ve_rows
from pipeline.mini_world.refcoco import INSTANCES, REFS, has_refs, write_image_refs
from pipeline.mini_world.text import coco_captions
from pipeline.mini_world.urlforms import flickr_url
from pipeline.mini_world.nlvr2 import write_nlvr2_pair
from pipeline.mini_world.vcr import SHAPE_STREAM, TEST_LABELS, write_vcr_image
from pipeline.mini_world.vqa import annotations_file, questions_file, write_image_questions
from pipeline.mini_world.world import World
from pipeline.params.world import COCO_CAPTION_IDS, COCO_IMAGE_IDS, COCO_INSTANCE_IDS

COCO_TRAIN = {"captions": "coco/annotations/captions_train2014.json",
              "instances": "coco/annotations/instances_train2014.json"}
KARPATHY = "coco/karpathy/dataset_coco.json"


def write_eval_extension(world: World) -> None:
    """Append the configured extra eval items of every task that has any. The order is part of the
    world: a RefCOCO+ extension draws COCO ids beside those drawn before it (the VQA images', and
    val's before test's, so that re-sizing the test split, which is sized from dev, never moves dev)."""
    if world.cfg.n_vqa_test_extra:
        _extend_vqa(world, world.cfg.n_vqa_test_extra)
    if world.cfg.n_refcoco_val_extra:
        _extend_refcoco(world, world.cfg.n_refcoco_val_extra, ("val",), "refcoco_val_extra")
    if world.cfg.n_refcoco_test_extra:
        _extend_refcoco(world, world.cfg.n_refcoco_test_extra, ("testA", "testB"), "refcoco_test_extra")
    if world.cfg.n_vcr_test_extra:
        _extend_vcr(world, world.cfg.n_vcr_test_extra)
    if world.cfg.n_nlvr2_test_extra_pairs:
        _extend_nlvr2(world, world.cfg.n_nlvr2_test_extra_pairs)
    if world.cfg.n_snli_ve_test_extra:
        _extend_snli_ve(world, world.cfg.n_snli_ve_test_extra)


def _extend_vqa(world: World, n_images: int) -> None:
    """COCO test2015 images with ids no COCO image of the world has, and their VQA test questions."""
    rng = world.rng("vqa_test_extra")
    ids = _fresh_ids(rng, COCO_IMAGE_IDS, _coco_ids(world), n_images)
    info = world.read_json(TEST2015_INFO)
    questions, answers = world.read_json(questions_file("test")), world.read_json(annotations_file("test"))
    for cid in ids:
        key, image = write_test2015_image(world, rng, cid)
        info["images"].append(image)
        write_image_questions(world, rng, key, "test", questions["questions"], answers["annotations"])
    world.write_json(TEST2015_INFO, info)
    world.write_json(questions_file("test"), questions)
    world.write_json(annotations_file("test"), answers)
    world.counts["coco_test2015_images"] = len(info["images"])
    world.counts["vqa_test_questions"] = len(questions["questions"])
    world.counts["vqa_test_extra_images"] = n_images


def _extend_refcoco(world: World, n_images: int, splits: tuple[str, ...], stream: str) -> None:
    """COCO train2014 images (Karpathy train) whose refs are all of one RefCOCO+ split, taking
    ``splits`` in turn (testA, testB: even, odd), drawn from the random stream ``stream``: each image is
    drawn until it has a target of its split that appearance words single out, so none stays a
    plain COCO image that pretraining would keep."""
    rng, coco = world.rng(stream), world.info["coco"]
    docs = {name: world.read_json(path) for name, path in COCO_TRAIN.items()}
    karpathy, ref_instances = world.read_json(KARPATHY), world.read_json(INSTANCES)
    refs = pickle.loads((world.root / REFS).read_bytes())
    ids = _fresh_ids(rng, COCO_IMAGE_IDS, _coco_ids(world), n_images)
    cap_ids = iter(_fresh_ids(rng, COCO_CAPTION_IDS, {a["id"] for a in docs["captions"]["annotations"]},
                              n_images * world.cfg.captions_per_image))
    inst_ids = iter(_fresh_ids(rng, COCO_INSTANCE_IDS, {a["id"] for a in docs["instances"]["annotations"]},
                               n_images * max(world.cfg.max_objects, 2)))
    sentid = 1 + max(s for im in karpathy["images"] for s in im["sentids"])
    parts: dict[str, list] = {"images": [], "captions": [], "instances": []}
    for j, cid in enumerate(ids):
        split = splits[j % len(splits)]
        fname = f"COCO_train2014_{cid:012d}.jpg"
        rec = world.new_image(rng, "coco", str(cid), f"coco/images/train2014/{fname}", min_objects=2,
                              accept=lambda scene: has_refs(scene, split))
        photo = world.photos.new(rng)
        caps = coco_captions(rng, rec.scene, world.cfg.captions_per_image)
        anns = add_coco_entries(parts, karpathy["images"], rec, "train2014", flickr_url(
            photo, "farm_staticflickr", size="z", https=False), caps, cap_ids, inst_ids, sentid, "train")
        sentid += len(caps)
        world.use(rec.key, "coco", "train")
        write_image_refs(world, rng, rec.key, split, [a["id"] for a in anns], refs)
        # what the closing listing of eval images (mini_world._register_eval_split_rows) reads
        coco["keys"].append(rec.key)
        coco["coco_url"][rec.key] = parts["images"][-1]["coco_url"]
    docs["captions"]["images"] += parts["images"]
    docs["captions"]["annotations"] += parts["captions"]
    docs["instances"]["images"] += parts["images"]
    docs["instances"]["annotations"] += parts["instances"]
    ref_instances["images"] += parts["images"]
    ref_instances["annotations"] += parts["instances"]
    for name, path in COCO_TRAIN.items():
        world.write_json(path, docs[name])
    world.write_json(KARPATHY, karpathy)
    world.write_json(INSTANCES, ref_instances)
    world.write_bytes(REFS, pickle.dumps(refs, protocol=2))
    world.counts["coco_train2014_images"] += n_images
    world.counts["coco_train2014_captions"] += len(parts["captions"])
    world.counts["coco_karpathy_train"] += n_images
    for split in splits:
        world.counts[f"refcoco_{split}_refs"] = sum(1 for r in refs if r["split"] == split)
    world.counts[f"{stream}_images"] = n_images


def _coco_ids(world: World) -> set[int]:
    """The ids of every COCO image of the world so far (train, val and test2015 alike)."""
    return {int(key.split("/")[1]) for key in world.images if key.startswith("coco/")}


def _fresh_ids(rng: np.random.Generator, pool: int, taken: set[int], n: int) -> list[int]:
    """``n`` different ids in 1..``pool`` outside ``taken``, in a random order."""
    drawn = rng.choice(pool, size=min(pool, n + len(taken)), replace=False) + 1
    ids = [int(i) for i in drawn if int(i) not in taken][:n]
    if len(ids) < n:
        raise RuntimeError(f"the id pool of {pool} holds fewer than {n} ids beside the {len(taken)} taken")
    return ids


def _extend_vcr(world: World, n_images: int) -> None:
    """VCR test images numbered after the world's own ``n_vcr`` (their movies follow its last one)."""
    rng, text_rng = world.rng("vcr_test_extra"), world.rng("vcr_test_extra_questions")
    shape_rng = world.rng(f"vcr_test_extra_{SHAPE_STREAM}")
    added: list[bytes] = []
    labels: list[bytes] = []
    for idx in range(world.cfg.n_vcr, world.cfg.n_vcr + n_images):
        # annot_ids continue the released test file's numbering ("test-<row>")
        write_vcr_image(world, rng, text_rng, idx, "test", added, labels, shape_rng=shape_rng,
                        row_base=world.counts["vcr_test_questions"])
    world.append_lines("vcr/test.jsonl", added)
    world.append_lines(TEST_LABELS, labels)
    world.counts["vcr_test_questions"] += len(added)
    world.counts["vcr_test_extra_images"] = n_images


def _extend_nlvr2(world: World, n_pairs: int) -> None:
    """NLVR2 test1 pairs whose set ids follow the world's own ``n_nlvr2_pairs``."""
    rng, text_rng = world.rng("nlvr2_test_extra"), world.rng("nlvr2_test_extra_statements")
    lines: list[bytes] = []
    for set_id in range(world.cfg.n_nlvr2_pairs, world.cfg.n_nlvr2_pairs + n_pairs):
        write_nlvr2_pair(world, rng, text_rng, set_id, "test1", lines, query_left=[])
    world.append_lines("nlvr2/test1.json", lines)
    world.counts["nlvr2_test1_statements"] += len(lines)
    world.counts["nlvr2_test_extra_pairs"] = n_pairs


def _extend_snli_ve(world: World, n_images: int) -> None:
    """Flickr30k photos with SNLI-VE test premises and hypotheses only. They stay out of the Karpathy
    file, so retrieval's test gallery keeps its size (docs/design.md §12: one gallery, whose size
    sets the task's difficulty) and its training split stays as it was; SNLI-VE reads a photo from
    the Flickr30k image folder by its id alone (its own split of Flickr30k, as the real one's)."""
    rng = world.rng("snli_ve_test_extra")
    lines: list[bytes] = []
    for _ in range(n_images):
        photo = world.photos.new(rng)
        pid = str(photo.photo_id)
        rec = world.new_image(rng, "flickr30k", pid, f"flickr30k/flickr30k-images/{pid}.jpg")
        lines += snli_ve_rows(rng, pid, rec.scene, coco_captions(rng, rec.scene, world.cfg.captions_per_image))
        world.use(rec.key, "snli_ve", "test")
    world.append_lines(SNLI_VE_TEST, lines)
    world.counts["snli_ve_test"] += len(lines)
    world.counts["snli_ve_test_extra_images"] = n_images
