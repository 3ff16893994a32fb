"""``extract coco`` also writes ``features/coco_gt``: it holds ``extract@coco_gt`` too, so a
concurrent ``extract coco_gt`` waits (or exits 3) instead of writing the same files."""

from __future__ import annotations

import os

from pipeline.common.locking import LockBusy, stage_keys, stage_locks


def test_extract_of_a_source_with_given_boxes_locks_both_items():
    assert stage_keys("extract", "coco") == [("extract", True), ("extract@coco", False), ("extract@coco_gt", False)]
    assert stage_keys("extract", "vcr") == [("extract", True), ("extract@vcr", False), ("extract@vcr_gt", False)]
    assert stage_keys("extract", "vg") == [("extract", True), ("extract@vg", False)]


def test_extract_coco_gt_cannot_run_beside_extract_coco(tmp_path):
    with stage_locks(tmp_path, "extract", "coco", wait=False):
        pid = os.fork()
        if pid == 0:  # another process (flock locks are per open file)
            try:
                with stage_locks(tmp_path, "extract", "coco_gt", wait=False):
                    os._exit(0)
            except LockBusy:
                os._exit(3)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 3
