"""The ``download@cc`` / ``download@sbu`` stage (``world: real``): fetch a web dataset's images with
img2dataset into ``sources.<dataset>.image_root``, the layout ``ingest@<dataset>`` reads
(``image_layout: img2dataset``; pipeline/ingest/sources/web_images.py).

1. The URL list: the URL and caption of every row the reader accepts (``parse``: the same line
   checks as ingest), each URL once (its first row), in file order, written to
   ``<image_root>/_download/url_list.parquet``. The list is a pure function of the source files, so a rerun
   gives img2dataset the same numbering; a different list over existing shards is refused (their
   keys were given against the old one).
2. img2dataset itself (``sources.download.command``, pinned, in a venv of its own: its pins need
   pandas<3) with ``output_format=files``, ``incremental_mode=incremental`` (a shard whose
   ``NNNNN_stats.json`` exists is not downloaded again: an interrupted run resumes by rerunning the
   stage) and ``disable_all_reencoding`` (the bytes as served: the detector resizes on its own).
3. Every shard must be finished afterwards; the counts per status go to
   ``<image_root>/_download/_run.json`` (not beside the shards: img2dataset reads every top-level
   ``*.json`` there as a shard's stats).

Not a DVC stage: its output is the raw input of ``ingest@`` (tracked there as a dep), and any
``dvc.yaml`` naming ``image_root`` as an output would overlap ``mini_world``'s (docs/real-data.md).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.common.runinfo import RunRecord
from pipeline.ingest.errors import DownloadError
from pipeline.ingest.sources import load_reader
from pipeline.common.source_records import ReadContext, Row, SourceFormatError
from pipeline.ingest.sources.web_images import SHARD_RE
from pipeline.params.parser import ParamsError

log = logging.getLogger(__name__)

DATASETS = ("cc", "sbu")
META_DIR = "_download"  # the stage's own files: a folder, img2dataset reads the top-level *.json as shard stats
URL_LIST = f"{META_DIR}/url_list.parquet"
RUN_FILE = f"{META_DIR}/_run.json"


def url_list(params, dataset: str) -> pa.Table:
    """``caption``, ``url`` of each row the reader accepts, first row per URL, in file order.

    Raises SourceFormatError when the reader accepts no row (nothing to fetch: the files are not
    the dataset's lists, or every line is damaged)."""
    reader = load_reader(dataset)
    ctx = ReadContext(params.sources, min_text_chars=params.ingest.min_text_chars,
                      max_text_chars=params.ingest.max_text_chars, progress=False)
    captions, urls, rows_in = [], [], 0
    for rows_in, item in enumerate(reader.parse(ctx), 1):
        if isinstance(item, Row):
            captions.append(item.values["text"])
            urls.append(item.values["url"])
    if not urls:
        files = " and ".join(str(p) for p in reader.input_files(params.sources).values())
        raise SourceFormatError(f"download@{dataset}: no URL to fetch: the {rows_in} lines of {files} were all "
                                f"rejected by the reader's checks; `python -m pipeline ingest {dataset}` writes "
                                f"why, line by line, to <paths.data>/manifests/{dataset}.rejects.parquet")
    table = pa.table({"caption": pa.array(captions, pa.string()), "url": pa.array(urls, pa.string()),
                      "row": pa.array(range(len(urls)), pa.int64())})
    first = table.group_by("url", use_threads=False).aggregate([("row", "min")]).column("row_min")
    return table.take(pc.sort_indices(first)).select(["caption", "url"])


def _check_inputs(params, dataset: str) -> None:
    """The reader's input files must exist (the CLI skips its path check for this stage: image_root
    is what it creates)."""
    reader = load_reader(dataset)
    for key, path in reader.input_files(params.sources).items():
        if not Path(path).exists():
            raise DownloadError(f"sources.{dataset}.{key}: path does not exist: {path}")
    command = params.sources.download.command
    if shutil.which(command) is None:
        raise DownloadError(f"sources.download.command: {command} is not an executable; install img2dataset "
                            "with `make setup-download` (a venv of its own) or point this key at one")


def _write_url_list(root: Path, table: pa.Table) -> Path:
    """Write the URL list, refusing to change the one existing shards were numbered against."""
    path = root / URL_LIST
    shards = [p for p in root.glob("*_stats.json") if SHARD_RE.fullmatch(p.name.removesuffix("_stats.json"))]
    if path.exists() and shards:
        try:
            old = pq.read_table(path)
        except (OSError, pa.ArrowInvalid) as err:
            raise DownloadError(f"{path}: not readable ({err}); the {len(shards)} shard(s) beside it were numbered "
                                "against it: use a fresh sources image_root, or delete the shards to download "
                                "again") from None
        if not old.equals(table):
            raise DownloadError(
                f"{path}: the URL list changed since {len(shards)} shard(s) were downloaded against it "
                f"({old.num_rows} -> {table.num_rows} URLs); img2dataset's keys follow the list, so resuming would "
                f"skip new URLs. Use a fresh sources image_root, or delete the shards to download again")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def img2dataset_command(cfg, url_list_path: Path, root: Path) -> list[str]:
    """The img2dataset command line (its ``fire`` CLI: ``--name=value``)."""
    return [cfg.command, f"--url_list={url_list_path}", "--input_format=parquet", "--url_col=url",
            "--caption_col=caption", "--output_format=files", f"--output_folder={root}",
            f"--processes_count={cfg.processes}", f"--thread_count={cfg.threads}", f"--timeout={cfg.timeout_s}",
            f"--retries={cfg.retries}", f"--number_sample_per_shard={cfg.samples_per_shard}",
            "--incremental_mode=incremental", "--disable_all_reencoding=True", "--encode_format=jpg",
            "--enable_wandb=False"]


def shard_stats(root: Path) -> dict[str, dict]:
    """``{shard name: its _stats.json}`` of every finished shard below ``root``."""
    out = {}
    for path in sorted(root.glob("*_stats.json")):
        name = path.name.removesuffix("_stats.json")
        if SHARD_RE.fullmatch(name):
            try:
                out[name] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                # img2dataset writes it last, not atomically, and takes its mere presence for a finished shard
                raise DownloadError(f"{path}: not readable JSON (an interrupted run cut it short?): delete it, "
                                    f"then rerun the stage to fetch shard {name} again") from None
    return out


def check_item(params, item: str) -> None:
    """Refuse an ITEM that is not a downloaded dataset (ParamsError); the CLI calls it before taking the locks."""
    if item not in DATASETS:
        raise ParamsError(f"download: no download for dataset {item!r} (one of {', '.join(DATASETS)})")


def download_dataset(params, dataset: str) -> dict[str, int]:
    """Download one dataset's images; returns the counts written to ``download._run.json``."""
    check_item(params, dataset)
    _check_inputs(params, dataset)
    src, cfg = getattr(params.sources, dataset), params.sources.download
    root = Path(src.image_root)
    if src.image_layout != "img2dataset":
        raise ParamsError(f"sources.{dataset}.image_layout is {src.image_layout}: download writes the "
                          "img2dataset layout; set it to img2dataset")
    record = RunRecord(f"download@{dataset}", params.section_digest("sources", "ingest"))
    start = time.time()
    table = url_list(params, dataset)
    list_path = _write_url_list(root, table)
    before = set(shard_stats(root))
    cmd = img2dataset_command(cfg, list_path, root)
    log.info("download@%s: %d URLs -> %s (%s)", dataset, table.num_rows, root, " ".join(cmd))
    proc = subprocess.run(cmd, check=False)
    stats = shard_stats(root)
    expected = math.ceil(table.num_rows / cfg.samples_per_shard)
    if proc.returncode != 0 or len(stats) < expected:
        raise DownloadError(f"download@{dataset}: img2dataset exited with {proc.returncode} and finished "
                            f"{len(stats)} of {expected} shards in {root}; rerun the stage to resume")
    counts = {"urls": table.num_rows, "shards": len(stats), "shards_resumed": len(before & set(stats))}
    for key in ("count", "successes", "failed_to_download", "failed_to_resize"):
        counts[key] = sum(int(s.get(key, 0)) for s in stats.values())
    record.counts.update(counts)
    record.extra["seconds"] = round(time.time() - start, 1)
    record.write(root / META_DIR)
    log.info("download@%s: %s", dataset, counts)
    return counts


def run(params, item: str | None = None) -> list[dict[str, int]]:
    """Stage entry: download ``item`` (cc or sbu), or each of them that ``ingest.datasets`` names."""
    if params.world != "real":
        raise ParamsError("download: world is mini, whose images the mini_world stage writes in this layout "
                          "already; set world: real and point sources at the real files")
    datasets = [item] if item else [d for d in DATASETS if d in params.ingest.datasets]
    if not datasets:
        raise ParamsError("download: ingest.datasets names neither cc nor sbu: nothing to download; name the "
                          "dataset (`python -m pipeline download cc`) or list it in ingest.datasets")
    return [download_dataset(params, name) for name in datasets]
