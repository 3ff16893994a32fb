"""One image source's extraction split over K tasks (GPUs, hosts), and the merge (docs/scaling.md).

``python -m pipeline extract SOURCE:k/K`` (1 <= k <= K) extracts part k of K: the shards a single
``extract SOURCE`` would cut (docs/design.md §8) split into K contiguous ranges, part k taking the
k-th (shards ``[(k-1)*n//K, k*n//K)`` of n). Item ``coco:k/K`` also writes part k of ``coco_gt``,
``vcr:k/K`` of ``vcr_gt``. A part writes ``<paths.data>/cache/extract_parts/<name>/<k>-of-<K>/``:
its shards under their global numbers with their ``.done`` markers, then ``part.json`` (its range,
the settings and the detector's ``meta.json`` content; written last, so it says the part is whole)
and ``_run.json``. Parts share nothing but the data directory, so they run side by side anywhere.

With ``extract.parts: K`` > 1, ``python -m pipeline extract [SOURCE]`` is the merge: it plans the
source exactly as a single task would and takes every shard from its part (a hard link, a copy
where the file system has none), never running the detector, then writes ``meta.json``,
``rejects.parquet`` and ``_run.json``. A shard counts only when its marker matches the plan (same
images, file sizes and settings), so the feature directory, and the image DB ``build_dbs`` makes
of it, are byte for byte what one task would write. A missing or stale part is an error naming the
command that makes it; after a merge the parts are removed.

Settings: the parts' device is part of the shards' digest (CUDA and CPU features differ), so the
merge, which may run on a host without a GPU, plans with the device the parts recorded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.ownership import claim_dir, remove_owned
from pipeline.common.runinfo import DONE_SUFFIX, RUN_FILE, RunRecord, atomic_write_json
from pipeline.extract.detector.runner import (ExtractorPool, ExtractSettings, RunSummary, ShardJob, effective_amp,
                                              finished, plan_shards, remove_stale_files, run_shards, settings_record)
from pipeline.extract.detector.shards import shard_name
from pipeline.extract.image_sets import detector_meta, feature_dir, make_settings, select, write_outputs
from pipeline.params.parser import Params, ParamsError

log = logging.getLogger("pipeline.extract")

PARTS_DIR = Path("cache") / "extract_parts"  # under cache/: scratch, never a stage output
PART_FILE = "part.json"
_ITEM = re.compile(r"(?P<source>[^:]*):(?P<k>\d+)/(?P<parts>\d+)")


@dataclass(frozen=True)
class Part:
    """Part ``k`` (1-based) of ``parts``."""

    k: int
    parts: int

    @property
    def label(self) -> str:
        return f"{self.k}-of-{self.parts}"

    def stage(self, name: str) -> str:
        return f"extract@{name}:{self.k}/{self.parts}"


def split_item(item: str | None) -> tuple[str | None, Part | None]:
    """``"cc:2/3"`` -> ``("cc", Part(2, 3))``; ``"cc"`` -> ``("cc", None)``; raises ParamsError (exit
    status 2) for a bad part."""
    if item is None or ":" not in item:
        return item, None
    match = _ITEM.fullmatch(item)
    if not match or not 1 <= int(match["k"]) <= int(match["parts"]):
        raise ParamsError(f"extract: item {item!r}: expected SOURCE:k/K with 1 <= k <= K (part k of K), e.g. cc:2/3")
    return match["source"], Part(int(match["k"]), int(match["parts"]))


def shard_range(n_shards: int, part: Part) -> tuple[int, int]:
    """``[lo, hi)``: the shards of ``part`` among ``n_shards`` (contiguous, sizes differing by at most one)."""
    return (part.k - 1) * n_shards // part.parts, part.k * n_shards // part.parts


def part_of(index: int, n_shards: int, parts: int) -> Part:
    """The part that extracts shard ``index``."""
    for k in range(1, parts + 1):
        lo, hi = shard_range(n_shards, Part(k, parts))
        if lo <= index < hi:
            return Part(k, parts)
    raise ValueError(f"shard {index} is not among {n_shards} shards")


def parts_root(params: Params, name: str) -> Path:
    return params.paths.data / PARTS_DIR / name


def part_dir(params: Params, name: str, part: Part) -> Path:
    """``<paths.data>/cache/extract_parts/<name>/<k>-of-<K>``."""
    return parts_root(params, name) / part.label


def _n_shards(n_items: int, shard_size: int) -> int:
    return -(-n_items // shard_size)


# ----------------------------------------------------------------------------- one part


def extract_part(params: Params, name: str, part: Part, pool: ExtractorPool) -> dict:
    """Write part ``part`` of feature set ``name`` into its part directory; return its ``part.json``."""
    sel = select(params, name)
    size = params.extract.shard_size
    n = _n_shards(len(sel.items), size)
    lo, hi = shard_range(n, part)
    out = claim_dir(part_dir(params, name, part), part.stage(name))
    (out / PART_FILE).unlink(missing_ok=True)  # the part is whole again only when this run ends
    settings = pool.settings
    jobs = plan_shards(sel.items[lo * size:hi * size], out, shard_size=size, settings=settings, mode=sel.mode)
    for job in jobs:  # global shard numbers: the merge takes shard i from whichever part holds it
        job.index += lo
        job.path = out / shard_name(job.index)
    _prune(out, keep={job.path.name for job in jobs})
    record = RunRecord(part.stage(name), params.section_digest("extract"))
    record.inputs.update({f"manifest_{i}": m for i, m in enumerate(sel.used)}, weights=settings.weights)
    summary = run_shards(jobs, pool, desc=part.stage(name))
    info = {"name": name, "part": part.k, "parts": part.parts, "shards": [lo, hi], "total_shards": n,
            "images_listed": len(sel.items), "settings": settings_record(settings),
            "settings_digest": settings.digest(), "meta": detector_meta(settings, sel.mode, pool.detector)}
    atomic_write_json(out / PART_FILE, info)
    record.counts.update(images=summary.images, regions=summary.regions, shards=summary.shards,
                         shards_skipped=summary.shards_skipped, rejected=len(summary.rejects))
    record.extra.update(part=info, workers=pool.workers)
    record.write(out)
    log.info("%s: shards [%d, %d) of %d: %d images, %d regions, %d rejected (%d shards reused)", part.stage(name),
             lo, hi, n, summary.images, summary.regions, len(summary.rejects), summary.shards_skipped)
    return info


def _prune(out: Path, keep: set[str]) -> None:
    """Remove shards (and markers) of ``out`` outside this part's range, and interrupted writes."""
    for path in sorted(out.glob(".shard-*.tmp")):
        path.unlink(missing_ok=True)
    for path in sorted(out.glob("shard-*.safetensors*")):
        if path.name.removesuffix(DONE_SUFFIX) not in keep:
            path.unlink()


# ----------------------------------------------------------------------------- the merge


def read_parts(params: Params, name: str, parts: int) -> dict[int, dict]:
    """``{k: part.json}`` of the finished parts of ``name`` (those of ``parts`` parts only)."""
    found = {}
    for k in range(1, parts + 1):
        path = part_dir(params, name, Part(k, parts)) / PART_FILE
        if path.is_file():
            found[k] = json.loads(path.read_text(encoding="utf-8"))
    return found


def merge_settings(params: Params, name: str, infos: dict[int, dict]) -> tuple[ExtractSettings, dict | None]:
    """The settings to plan with (params' extract section on the parts' device) and the detector meta.

    Raises ValueError when the parts disagree with each other or with params.yaml.
    """
    expected, _ = make_settings(params)
    recorded = None
    if infos:
        recorded = infos[min(infos)]
    elif (feature_dir(params, name) / RUN_FILE).is_file():  # an earlier merge (or single run) of this set
        run = json.loads((feature_dir(params, name) / RUN_FILE).read_text(encoding="utf-8"))
        meta_path = feature_dir(params, name) / "meta.json"
        if "settings" in run and meta_path.is_file():
            recorded = {"settings": run["settings"], "meta": json.loads(meta_path.read_text(encoding="utf-8"))}
    if recorded is None:
        return expected, None
    device = recorded["settings"]["device"]  # the parts' device decides the dtype that applies there too
    settings = dataclasses.replace(expected, device=device, amp=effective_amp(params.extract.amp, device))
    for k, info in sorted(infos.items()):
        if info["settings_digest"] != settings.digest() or info["meta"] != recorded["meta"]:
            now = settings_record(settings)
            diff = {key: f"{value!r} (part) vs {now.get(key)!r} (params)" for key, value in info["settings"].items()
                    if key not in ("weights", "threads") and value != now.get(key)}
            raise ValueError(f"{Part(k, info['parts']).stage(name)} was extracted with other settings than params' "
                             f"extract section on device {settings.device}: {diff or 'the detector differs'}; "
                             f"run `python -m pipeline extract {name}:{k}/{info['parts']}` again")
    return settings, recorded["meta"]


def merge_parts(params: Params, name: str, parts: int) -> dict:
    """Build ``data/features/<name>/`` from its ``parts`` parts, as one ``extract`` task would; return
    the run record. Raises RuntimeError naming each part still to run."""
    infos = read_parts(params, name, parts)
    settings, meta = merge_settings(params, name, infos)
    sel = select(params, name)
    out = feature_dir(params, name)
    jobs = plan_shards(sel.items, out, shard_size=params.extract.shard_size, settings=settings, mode=sel.mode)
    _check_cut(name, infos, len(jobs))
    adopt, missing = [], set()  # (part's shard, output shard) to link; parts to run first
    for job in jobs:
        if finished(job) is not None:
            continue
        part = part_of(job.index, len(jobs), parts)
        source = dataclasses.replace(job, path=part_dir(params, name, part) / shard_name(job.index))
        if finished(source) is None:
            missing.add(part)
        else:
            adopt.append((source.path, job.path))
    if missing or (jobs and meta is None):  # checked before anything is written: a failed merge changes nothing
        todo = sorted(missing, key=lambda p: p.k) or [Part(k, parts) for k in range(1, parts + 1)]
        root = parts_root(params, name)
        present = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        raise RuntimeError(f"extract@{name}: cannot merge {parts} parts (extract.parts): part(s) "
                           f"{[p.label for p in todo]} missing or stale in {root} (present: {present or 'none'}); run "
                           + ", ".join(f"`python -m pipeline extract {name}:{p.k}/{p.parts}`" for p in todo))
    claim_dir(out, f"extract@{name}")
    remove_stale_files(out, keep=len(jobs))
    for source, target in adopt:
        _adopt(source, target)
    if meta is None:  # no images at all: nothing to merge, the detector says what meta.json holds
        meta = detector_meta(settings, sel.mode)
    summary = summarize(jobs, kept=len(jobs) - len(adopt))
    result = write_outputs(params, sel, settings, summary, meta, workers=None,
                           extra={"merged_parts": parts, "shards_adopted": len(adopt)})
    for k in range(1, parts + 1):
        remove_owned(part_dir(params, name, Part(k, parts)))
    for empty in (parts_root(params, name), parts_root(params, name).parent):
        if empty.is_dir() and not any(empty.iterdir()):
            empty.rmdir()
    return result


def _check_cut(name: str, infos: dict[int, dict], n_shards: int) -> None:
    """The parts must have cut the same shards as the plan (else the manifests changed since)."""
    for k, info in sorted(infos.items()):
        if info["total_shards"] != n_shards:
            raise RuntimeError(f"{Part(k, info['parts']).stage(name)} cut {info['total_shards']} shards, the "
                               f"manifests now give {n_shards}: run `python -m pipeline extract {name}:{k}/"
                               f"{info['parts']}` again")


def _adopt(source: Path, target: Path) -> None:
    """Put ``source`` (a finished shard) and its marker at ``target``: hard links (no bytes copied)
    where the file system allows, else copies; each file renamed into place, the marker last."""
    Path(str(target) + DONE_SUFFIX).unlink(missing_ok=True)
    for src, dst in ((source, target), (Path(str(source) + DONE_SUFFIX), Path(str(target) + DONE_SUFFIX))):
        tmp = dst.with_name(f".{dst.name}.merge.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:  # another file system, or one without hard links
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)


def summarize(jobs: list[ShardJob], kept: int) -> RunSummary:
    """Totals over the finished shards of ``jobs`` from their markers (``kept``: already in place)."""
    summary = RunSummary(shards_skipped=kept)
    for job in jobs:
        marker = finished(job)
        if marker is None:
            raise RuntimeError(f"{job.path}: no matching .done marker after the merge")
        summary.shards += 1
        summary.images += marker["images"]
        summary.regions += marker["regions"]
        summary.rejects.extend(marker["rejects"])
    return summary
