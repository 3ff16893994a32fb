"""Sharded, resumable region extraction over many images, on CPU processes or one process per GPU.

The image list is cut into shards of ``shard_size`` consecutive items. Each shard is decoded
(bad images become rejects, never exceptions), run through the detector in batches (by an
:class:`ExtractorPool`: in this process, or spread over worker processes batch by batch), and written
atomically as ``shard-%05d.safetensors`` followed by its ``.done`` marker. The marker records a
digest of the shard's inputs (image ids, paths, file sizes, given boxes) and of the extraction
settings, plus the shard's rejects; a rerun skips every shard whose marker matches, so a killed
run resumes where it stopped and produces the same bytes as an uninterrupted one.

Setting ``PIPELINE_EXTRACT_STOP_AFTER_SHARDS=k`` stops a run after it has written k shards (by
raising :class:`ExtractionInterrupted`): how tests interrupt a run at a known point.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from pipeline.common.runinfo import DONE_SUFFIX, atomic_write_bytes, is_done, mark_done
from pipeline.common.image_io import ImageRejected, decode_image

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
    amp: str | None = "bf16"  # autocast dtype: bf16 | fp16 | None, as it applies (:func:`effective_amp`)
    # torch intra-op threads per CPU worker. Results change with the thread count (parallel
    # reductions split differently), so it is fixed: parallelism comes from worker processes,
    # and the bytes do not depend on how many workers ran.
    threads: int = 1
    proposals: int | None = None  # RPN proposals per image; None: the preset's

    def digest(self) -> str:
        """What the shard bytes depend on (everything but ``threads``, which is fixed)."""
        keys = ("preset", "weights_digest", "device", "batch_size", "conf_th", "min_boxes", "max_boxes", "amp")
        payload = {k: getattr(self, k) for k in keys}
        if self.proposals is not None:  # only when set: the shards of the preset's count keep their digest
            payload["proposals"] = self.proposals
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def effective_amp(amp: str, device: str) -> str | None:
    """The autocast dtype extraction runs in for ``extract.amp`` (bf16 | fp16 | none) on ``device``:
    as asked on CUDA, fp32 (None) on a CPU. Recorded in the settings, so the shards' digest and
    ``_run.json`` say what ran. bf16 on a CPU with native bf16 takes ~0.6x the time with the same
    held-out detector quality, but moves every feature by ~1% and so every later number
    (docs/decisions.md#extract-fp32-cpu): a different feature set, not a faster way to this one."""
    return amp if device == "cuda" and amp != "none" else None


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
    from pipeline.extract.detector.extractor import RegionExtractor, autocast_dtype

    device = settings.device
    if device == "cuda":
        index = gpu_queue.get() if gpu_queue is not None else 0
        device = f"cuda:{index}"
        torch.cuda.set_device(index)
    else:
        torch.set_num_threads(max(1, settings.threads))
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False
    amp = autocast_dtype(settings.amp)
    detector = load_detector(settings.preset, settings.weights, device=device, proposals=settings.proposals)
    _WORKER["extractor"] = RegionExtractor(detector, conf_th=settings.conf_th, min_boxes=settings.min_boxes,
                                           max_boxes=settings.max_boxes, batch_size=settings.batch_size, amp=amp)


def _init_spawned_worker(settings: ExtractSettings, gpu_queue=None) -> None:
    """:func:`_init_worker` in a pool's own process, which then ends without the interpreter's
    teardown (~1.5 s with torch and detectron2 loaded, which the pool's shutdown waits for)."""
    from pipeline.common.exiting import end_at_interpreter_exit
    from pipeline.common.malloc import keep_freed_memory

    keep_freed_memory()  # as the stage process did: malloc's settings are not inherited by a spawned child
    try:
        _init_worker(settings, gpu_queue)
    except Exception as err:
        from pipeline.common.failures import describe

        known = describe(err)
        if known is None:
            raise  # a bug: the pool prints the traceback
        # bad weights and the like: the driver loads the same file and says it in one line with its
        # exit status; a traceback from each helper would follow that line
        os._exit(known[0])
    end_at_interpreter_exit()


def _ready() -> bool:
    """A no-op job: submitted once per worker at start, so the workers load while the driver plans."""
    return True


def _run_batch(images: list[np.ndarray], given: list[np.ndarray] | None) -> list:
    """Worker side of :meth:`ExtractorPool.run_batches`: one planned batch -> its images' regions."""
    return _WORKER["extractor"].extract_batch(images, given)


def _run_shard(job: ShardJob) -> dict:
    """Worker side of a whole shard (when there are shards for every worker): decode, extract, write."""
    return process_shard(job, Local(_WORKER["extractor"]))


def _decode(item: ImageItem) -> np.ndarray | ImageRejected:
    try:
        return decode_image(item.path)
    except ImageRejected as rej:
        return rej


# ------------------------------------------------------------------------------- driver side


class Local:
    """Runs every batch right here, with ``extractor`` (a :class:`RegionExtractor`)."""

    def __init__(self, extractor) -> None:
        self.extractor = extractor

    @property
    def detector(self):
        return self.extractor.detector

    def run_batches(self, batches: list[tuple[list[np.ndarray], list[np.ndarray] | None]]) -> list[list]:
        """(images, given boxes or None) per planned batch -> each batch's regions, in order."""
        return [self.extractor.extract_batch(images, given) for images, given in batches]

    def results(self, jobs: list[ShardJob]) -> Iterator[tuple[ShardJob, dict]]:
        """Write the shards of ``jobs``; yield (job, marker) as each is written."""
        for job in jobs:
            yield job, process_shard(job, self)


class ExtractorPool(Local):
    """Where the detector runs: in this process alone (``workers`` <= 1) or with spawned helpers:
    on the CPU this process and ``workers`` - 1 others, one torch thread each; on CUDA one spawned
    process per GPU (this process keeps a CPU copy for planning and the class names).

    A shard's batches are planned by :meth:`RegionExtractor.plan_batches` wherever it runs, so its
    bytes are the same for any number of workers. With two or more shards to write per worker,
    each worker takes whole shards; with fewer (a small source is one shard), this process decodes
    each shard and plans its batches and the workers share them, so none idles. Open it once per
    stage run: the workers load the detector once for all its feature sets.
    """

    def __init__(self, settings: ExtractSettings, workers: int) -> None:
        self.settings, self.workers = settings, max(1, workers)
        self._computes_here = settings.device == "cpu"  # a CUDA driver's copy is on the CPU: other bits
        self._spawned = 0 if self.workers == 1 else self.workers - self._computes_here
        self._pool = None
        self._saved: tuple | None = None

    def __enter__(self) -> "ExtractorPool":
        import torch

        # the driver's own extractor sets torch as the workers' do; restored on exit
        self._saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                       torch.is_deterministic_algorithms_warn_only_enabled(),
                       torch.utils.deterministic.fill_uninitialized_memory)
        if self._spawned:  # first, so that the helpers load while this process does
            import multiprocessing as mp

            ctx = mp.get_context("spawn")  # a fresh interpreter: no forked OpenMP pools
            queue = None
            if self.settings.device == "cuda":
                queue = ctx.Manager().Queue()
                for gpu in range(self._spawned):
                    queue.put(gpu)
            self._pool = ProcessPoolExecutor(self._spawned, mp_context=ctx, initializer=_init_spawned_worker,
                                             initargs=(self.settings, queue))
            for _ in range(self._spawned):
                self._pool.submit(_ready)
        local = self.settings if self._computes_here else dataclasses.replace(self.settings, device="cpu")
        _init_worker(local)
        super().__init__(_WORKER.pop("extractor"))
        return self

    def __exit__(self, *exc) -> None:
        import torch

        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        assert self._saved is not None
        torch.set_num_threads(self._saved[0])
        torch.use_deterministic_algorithms(self._saved[1], warn_only=self._saved[2])
        torch.utils.deterministic.fill_uninitialized_memory = self._saved[3]

    def run_batches(self, batches: list[tuple[list[np.ndarray], list[np.ndarray] | None]]) -> list[list]:
        if self._pool is None:
            return super().run_batches(batches)
        out: list[list] = [[] for _ in batches]
        for i, regions in self._share(batches, _run_batch, self.extractor.extract_batch):
            out[i] = regions
        return out

    def results(self, jobs: list[ShardJob]) -> Iterator[tuple[ShardJob, dict]]:
        if self._pool is None or len(jobs) < 2 * self.workers:  # whole shards: the last would leave workers idle
            yield from super().results(jobs)
            return
        here = Local(self.extractor)
        for i, marker in self._share([(job,) for job in jobs], _run_shard, lambda job: process_shard(job, here)):
            yield jobs[i], marker

    def _share(self, jobs: list[tuple], remote, local) -> Iterator[tuple[int, Any]]:
        """Run ``remote(*job)`` on the helpers and, on the CPU, ``local(*job)`` here too, each job
        once; yield (index, result) as they finish. Two jobs per helper are queued, so a helper
        never waits while this process runs one of its own (taken from the back of the list)."""
        assert self._pool is not None
        pending, running = deque(range(len(jobs))), {}
        try:
            while pending or running:
                while pending and len(running) < 2 * self._spawned:
                    i = pending.popleft()
                    running[self._pool.submit(remote, *jobs[i])] = i
                if pending and self._computes_here:
                    i = pending.pop()
                    yield i, local(*jobs[i])
                elif running:
                    wait(running, return_when=FIRST_COMPLETED)
                for future in [f for f in running if f.done()]:
                    yield running.pop(future), future.result()
        finally:
            for future in running:
                future.cancel()


def process_shard(job: ShardJob, runner: Local) -> dict:
    """Decode ``job``'s images (bad ones become rejects), run their planned batches with ``runner``,
    write the shard and its marker; return the marker's content."""
    from pipeline.extract.detector.shards import encode_shard

    with ThreadPoolExecutor(_DECODE_THREADS) as threads:
        decoded = list(threads.map(_decode, job.items))
    kept, images, rejects = [], [], []
    for item, result in zip(job.items, decoded):
        if isinstance(result, ImageRejected):
            rejects.append({"image_id": item.image_id, "image_path": item.path, "reason": result.reason,
                            "detail": result.detail})
        else:
            kept.append(item)
            images.append(result)
    given = [np.asarray(it.boxes or (), dtype=np.float32).reshape(-1, 4) for it in kept] if job.mode == "given" else None
    plan = runner.extractor.plan_batches(images)
    batches = [([images[i] for i in chunk], None if given is None else [given[i] for i in chunk]) for chunk in plan]
    regions: list = [None] * len(kept)
    for chunk, batch_regions in zip(plan, runner.run_batches(batches)):
        for i, r in zip(chunk, batch_regions):
            regions[i] = r
    det = runner.detector
    data = encode_shard([it.image_id for it in kept], regions, feature_dim=det.feature_dim,
                        num_classes=det.num_classes,
                        box_ids=[list(it.box_ids or ()) for it in kept] if job.mode == "given" else None)
    atomic_write_bytes(job.path, data)
    marker = {"inputs_digest": job.inputs_digest, "images": len(kept),
              "regions": int(sum(len(r.boxes) for r in regions)), "rejects": rejects}
    mark_done(job.path, marker)
    return marker


def _stop_after() -> int | None:
    value = os.environ.get(STOP_ENV)
    return int(value) if value else None


def run_shards(jobs: list[ShardJob], pool: Local, *, desc: str) -> RunSummary:
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
        for job, marker in pool.results(pending):
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
