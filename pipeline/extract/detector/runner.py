"""Sharded, resumable region extraction over many images, on CPU processes or one process per GPU.

The image list is cut into shards of ``shard_size`` consecutive items. Each shard is decoded
(bad images become rejects, never exceptions), run through the detector in batches, and written
atomically as ``shard-%05d.safetensors`` followed by its ``.done`` marker. The marker records a
digest of the shard's inputs (image ids, paths, file sizes, given boxes) and of the extraction
settings, plus the shard's rejects; a rerun skips every shard whose marker matches, so a killed
run resumes where it stopped and produces the same bytes as an uninterrupted one.

Setting ``PIPELINE_EXTRACT_STOP_AFTER_SHARDS=k`` stops a run after it has written k shards (by
raising :class:`ExtractionInterrupted`): how tests interrupt a run at a known point.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from pipeline.common.runinfo import DONE_SUFFIX, atomic_write_bytes, is_done, mark_done
from pipeline.ingest.image_io import ImageRejected, decode_image

log = logging.getLogger(__name__)
STOP_ENV = "PIPELINE_EXTRACT_STOP_AFTER_SHARDS"
_DECODE_THREADS = 4


class ExtractionInterrupted(RuntimeError):
    """Raised when ``PIPELINE_EXTRACT_STOP_AFTER_SHARDS`` shards were written."""


@dataclass(frozen=True)
class ImageItem:
    """One image to featurize; ``boxes`` [k, 4] x1, y1, x2, y2 pixels and ``box_ids`` in given mode."""

    image_id: str
    path: str
    boxes: tuple[tuple[float, float, float, float], ...] | None = None
    box_ids: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class ExtractSettings:
    """Everything a worker needs to rebuild the extractor (picklable)."""

    preset: str
    weights: str
    weights_digest: str
    device: str  # cpu | cuda
    batch_size: int
    conf_th: float
    min_boxes: int
    max_boxes: int
    amp: str | None = "bf16"  # CUDA autocast dtype: bf16 | fp16 | None
    # torch intra-op threads per CPU worker. Results change with the thread count (parallel
    # reductions split differently), so it is fixed: parallelism comes from worker processes,
    # and the bytes do not depend on how many workers ran.
    threads: int = 1

    def digest(self) -> str:
        """What the shard bytes depend on (everything but ``threads``, which is fixed)."""
        keys = ("preset", "weights_digest", "device", "batch_size", "conf_th", "min_boxes", "max_boxes", "amp")
        payload = {k: getattr(self, k) for k in keys}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass
class ShardJob:
    index: int
    path: Path
    items: list[ImageItem]
    inputs_digest: str = ""
    mode: str = "detected"  # detected | given


@dataclass
class RunSummary:
    shards: int = 0
    shards_skipped: int = 0
    images: int = 0
    regions: int = 0
    rejects: list[dict[str, str]] = field(default_factory=list)


def plan_shards(items: list[ImageItem], out_dir: Path, *, shard_size: int, settings: ExtractSettings,
                mode: str) -> list[ShardJob]:
    """Cut ``items`` (already sorted) into shard jobs with their input digests."""
    from pipeline.extract.detector.shards import shard_name

    if shard_size < 1:
        raise ValueError(f"extract.shard_size must be >= 1, got {shard_size}")
    jobs = []
    for index, start in enumerate(range(0, len(items), shard_size)):
        chunk = items[start:start + shard_size]
        h = hashlib.sha256(settings.digest().encode())
        h.update(mode.encode())
        for it in chunk:
            size = os.path.getsize(it.path) if os.path.isfile(it.path) else -1
            h.update(json.dumps([it.image_id, it.path, size, it.boxes, it.box_ids], default=str).encode())
        jobs.append(ShardJob(index, out_dir / shard_name(index), chunk, h.hexdigest(), mode))
    return jobs


def finished(job: ShardJob) -> dict | None:
    """The marker of a shard written with the same inputs and settings, else None."""
    if not is_done(job.path):
        return None
    marker = json.loads(Path(str(job.path) + DONE_SUFFIX).read_text())
    return marker if marker.get("inputs_digest") == job.inputs_digest else None


# ------------------------------------------------------------------------------- worker side

_WORKER: dict[str, Any] = {}


def _init_worker(settings: ExtractSettings, gpu_queue=None) -> None:
    """Build the detector once per worker process (or once in-process)."""
    import torch

    from pipeline.extract.detector.build import load_detector
    from pipeline.extract.detector.extractor import RegionExtractor

    device = settings.device
    if device == "cuda":
        index = gpu_queue.get() if gpu_queue is not None else 0
        device = f"cuda:{index}"
        torch.cuda.set_device(index)
    else:
        torch.set_num_threads(max(1, settings.threads))
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(settings.amp or "")
    detector = load_detector(settings.preset, settings.weights, device=device)
    _WORKER["extractor"] = RegionExtractor(detector, conf_th=settings.conf_th, min_boxes=settings.min_boxes,
                                           max_boxes=settings.max_boxes, batch_size=settings.batch_size, amp=amp)


def _decode(item: ImageItem) -> np.ndarray | ImageRejected:
    try:
        return decode_image(item.path)
    except ImageRejected as rej:
        return rej


def process_shard(job: ShardJob) -> dict:
    """Decode, extract and write one shard (+ marker); return the marker's content."""
    from pipeline.extract.detector.shards import encode_shard

    extractor = _WORKER["extractor"]
    with ThreadPoolExecutor(_DECODE_THREADS) as pool:
        decoded = list(pool.map(_decode, job.items))
    kept, images, rejects = [], [], []
    for item, result in zip(job.items, decoded):
        if isinstance(result, ImageRejected):
            rejects.append({"image_id": item.image_id, "image_path": item.path, "reason": result.reason,
                            "detail": result.detail})
        else:
            kept.append(item)
            images.append(result)
    given = [np.asarray(it.boxes or (), dtype=np.float32).reshape(-1, 4) for it in kept] if job.mode == "given" else None
    regions = extractor.extract(images, given)
    det = extractor.detector
    data = encode_shard([it.image_id for it in kept], regions, feature_dim=det.feature_dim,
                        num_classes=det.num_classes,
                        box_ids=[list(it.box_ids or ()) for it in kept] if job.mode == "given" else None)
    atomic_write_bytes(job.path, data)
    marker = {"inputs_digest": job.inputs_digest, "images": len(kept), "regions": int(sum(len(r.boxes) for r in regions)),
              "rejects": rejects}
    mark_done(job.path, marker)
    return marker


# ------------------------------------------------------------------------------- driver side


def _stop_after() -> int | None:
    value = os.environ.get(STOP_ENV)
    return int(value) if value else None


def _results(jobs: list[ShardJob], settings: ExtractSettings, workers: int) -> Iterator[tuple[ShardJob, dict]]:
    """Run ``jobs`` in-process (one worker) or in a spawn pool; yield (job, marker) as they finish."""
    if workers <= 1 or len(jobs) <= 1:
        import torch

        saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                 torch.is_deterministic_algorithms_warn_only_enabled(),
                 torch.utils.deterministic.fill_uninitialized_memory)
        try:  # in-process: leave the caller's torch settings as they were
            _init_worker(settings)
            for job in jobs:
                yield job, process_shard(job)
        finally:
            _WORKER.clear()
            torch.set_num_threads(saved[0])
            torch.use_deterministic_algorithms(saved[1], warn_only=saved[2])
            torch.utils.deterministic.fill_uninitialized_memory = saved[3]
        return
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = None
    if settings.device == "cuda":
        queue = ctx.Manager().Queue()
        for gpu in range(workers):
            queue.put(gpu)
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(settings, queue)) as pool:
        futures = {pool.submit(process_shard, job): job for job in jobs}
        from concurrent.futures import as_completed

        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()


def run_shards(jobs: list[ShardJob], settings: ExtractSettings, *, workers: int, desc: str) -> RunSummary:
    """Write every unfinished shard of ``jobs``; return totals over all shards (skipped included).

    Raises ExtractionInterrupted after ``$PIPELINE_EXTRACT_STOP_AFTER_SHARDS`` written shards.
    """
    from pipeline.common.progress import track

    summary = RunSummary()
    markers: dict[int, dict] = {}
    pending = []
    for job in jobs:
        marker = finished(job)
        if marker is None:
            pending.append(job)
        else:
            markers[job.index] = marker
            summary.shards_skipped += 1
    stop_after = _stop_after()
    written = 0
    with track(total=len(jobs), initial=len(markers), desc=desc, unit="shard") as bar:
        for job, marker in _results(pending, settings, workers):
            markers[job.index] = marker
            written += 1
            bar.update(1)
            if stop_after is not None and written >= stop_after and len(markers) < len(jobs):
                raise ExtractionInterrupted(f"{desc}: stopped after {written} shard(s) (${STOP_ENV}={stop_after})")
    for index in sorted(markers):
        marker = markers[index]
        summary.shards += 1
        summary.images += marker["images"]
        summary.regions += marker["regions"]
        summary.rejects.extend(marker["rejects"])
    return summary


def remove_stale_files(out_dir: Path, keep: int) -> int:
    """Delete shards (and markers) numbered >= ``keep`` left by a larger earlier run, and the
    temporary files of writes that a kill interrupted; return how many files went."""
    removed = 0
    for path in sorted(out_dir.glob(".shard-*.tmp")):
        path.unlink(missing_ok=True)
        removed += 1
    for path in sorted(out_dir.glob("shard-*.safetensors*")):
        number = path.name.split(".")[0].split("-")[1]
        if number.isdigit() and int(number) >= keep:
            path.unlink()
            removed += 1
    return removed


def settings_record(settings: ExtractSettings) -> dict:
    return asdict(settings)
