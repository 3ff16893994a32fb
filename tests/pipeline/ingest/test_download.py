"""``download@cc|sbu`` for real: img2dataset itself fetches the mini world's CC/SBU images from an
HTTP server on 127.0.0.1 (the source files rewritten to point there; a few URLs answer 404, one a
truncated body), then ``ingest`` reads what it wrote. Needs img2dataset (`make setup-download`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.ingest.download import RUN_FILE, URL_LIST, run
from pipeline.ingest.ingest import ingest_dataset
from pipeline.params.parser import load_params, load_raw
from helpers.mini_world import small_config
from pipeline.common.source_records import URL_RE
from pipeline.mini_world import generate
from pipeline.mini_world.shards import SHARD_SCHEMA

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

REPO = Path(__file__).resolve().parents[3]
IMG2DATASET = REPO / ".venv-img2dataset" / "bin" / "img2dataset"
N_404 = 3  # rows whose image the server does not have, beside the world's planted missing image
PER_SHARD = 40

needs_img2dataset = pytest.mark.skipif(not IMG2DATASET.exists(), reason="img2dataset is not installed "
                                       "(make setup-download)")


class Server:
    """Serves ``files`` ({path: bytes}); paths in ``truncated`` get half their bytes under the full Content-Length."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.truncated: set[str] = set()
        self.requests: Counter = Counter()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                outer.requests[self.path] += 1
                data = outer.files.get(self.path)
                if data is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "image/jpeg")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2] if self.path in outer.truncated else data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("download")
    generate(small_config(root / "mini"), 0, progress=False)
    server = Server()
    yield root, server, _rewrite_sources(root, server)
    server.httpd.shutdown()


def _served_images(world_dir: Path, dataset: str) -> dict[str, bytes | None]:
    """{url: image bytes as the mini world downloaded them, None for its failed download}."""
    out = {}
    image_dir = world_dir / dataset / "images"
    for shard in sorted(image_dir.glob("*.parquet")):
        for row in pq.read_table(shard).to_pylist():
            path = image_dir / shard.stem / f"{row['key']}.jpg"
            out[row["url"]] = path.read_bytes() if row["status"] == "success" else None
    return out


def _rewrite(url: bytes, images: dict, server: Server, dataset: str, plan: dict, where: tuple[str, int]) -> bytes:
    """The URL served from 127.0.0.1 in place of ``url`` (lines with bad URLs are kept as they are);
    ``plan[path] = (file name, line number)`` of the row."""
    text = url.decode("utf-8", errors="replace")
    if URL_RE.match(text) is None or text not in images:
        return url
    path = f"/{dataset}/{len(plan)}.jpg"
    plan[path] = where
    data = images[text]
    if data is not None:
        server.files[path] = data
    return (server.base + path).encode()


def _rewrite_sources(root: Path, server: Server) -> dict[str, list[str]]:
    """Copies of the CC/SBU files whose URLs point at ``server``; returns {dataset: [served path, ...]}
    of the rows without a planted line defect (the rows whose URLs download@ hands to img2dataset)."""
    planted = json.loads((root / "mini" / "planted.json").read_text())["defects"]
    # (file, line) of CC; SBU's line N is one row of both its files
    bad_lines = {(Path(d["file"]).name if d["dataset"] == "cc" else "sbu", d["locator"])
                 for d in planted if d["locator_kind"] == "line" and d["dataset"] in ("cc", "sbu")}
    world_dir, out = root / "mini", {}
    for dataset, files in (("cc", ["Train_GCC-training.tsv", "Validation_GCC-1.1.0-Validation.tsv"]),
                           ("sbu", ["SBU_captioned_photo_dataset_urls.txt"])):
        images, plan = _served_images(world_dir, dataset), {}
        (root / "real" / dataset).mkdir(parents=True, exist_ok=True)
        for name in files:
            lines = (world_dir / dataset / name).read_bytes().split(b"\n")
            if dataset == "cc":
                new = [b"\t".join(f[:1] + [_rewrite(f[1], images, server, dataset, plan, (name, n))])
                       if len(f) == 2 else line for n, line in enumerate(lines, 1) for f in [line.split(b"\t")]]
            else:
                new = [_rewrite(line, images, server, dataset, plan, ("sbu", n)) for n, line in enumerate(lines, 1)]
            (root / "real" / dataset / name).write_bytes(b"\n".join(new))
        out[dataset] = [path for path, where in plan.items() if where not in bad_lines]
    (root / "real" / "sbu" / "SBU_captioned_photo_dataset_captions.txt").write_bytes(
        (world_dir / "sbu" / "SBU_captioned_photo_dataset_captions.txt").read_bytes())
    return out


def _params(root: Path, dataset: str, *, served: bool = True):
    """world: real params over the mini world's files; ``served``: CC/SBU are the rewritten copies and
    their images go to ``real/<dataset>/images`` (else the mini world's own files and layout)."""
    raw = load_raw(REPO / "params.yaml")
    default_root = raw["mini_world"]["out_dir"]
    overrides = [f"sources.{ds}.{key}={str(v).replace(default_root, str(root / 'mini'), 1)}"
                 for ds, section in raw["sources"].items() if ds != "download" for key, v in section.items()
                 if str(v).startswith(default_root)]
    real = root / "real"
    overrides += ["world=real", f"paths.data={root / ('data' if served else 'data_mini')}"]
    overrides += [
        f"sources.cc.train_tsv={real / 'cc/Train_GCC-training.tsv'}",
        f"sources.cc.val_tsv={real / 'cc/Validation_GCC-1.1.0-Validation.tsv'}",
        f"sources.sbu.urls={real / 'sbu/SBU_captioned_photo_dataset_urls.txt'}",
        f"sources.sbu.captions={real / 'sbu/SBU_captioned_photo_dataset_captions.txt'}",
        f"sources.{dataset}.image_root={real / dataset / 'images'}",
        f"sources.download.command={IMG2DATASET}", "sources.download.processes=1", "sources.download.threads=8",
        "sources.download.timeout_s=5", f"sources.download.samples_per_shard={PER_SHARD}"] if served else []
    return load_params(REPO / "params.yaml", overrides, check_paths=False)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "download", *args], cwd=REPO, capture_output=True,
                          text=True, check=False)


def test_cli_creates_the_image_root_the_path_check_would_demand(tmp_path):
    """world: real needs sources.cc.image_root for ingest@cc; download, which creates it, is checked for
    the files it reads (the TSVs, at parse time: exit 2), then the img2dataset executable."""
    tsv = tmp_path / "train.tsv"
    tsv.write_text("a caption\thttp://example.com/1.jpg\n")
    common = ["--set", "world=real", "--set", f"sources.cc.image_root={tmp_path / 'images'}",
              "--set", f"sources.cc.train_tsv={tsv}", "--set", f"paths.data={tmp_path / 'data'}"]
    out = _cli("cc", *common, "--set", f"sources.cc.val_tsv={tmp_path / 'absent.tsv'}")
    assert out.returncode == 2, out.stderr
    assert f"sources.cc.val_tsv: path does not exist: {tmp_path / 'absent.tsv'} (needed by download@cc)" in out.stderr
    assert "image_root" not in out.stderr
    for val in (tsv, "null"):  # the validation TSV is optional
        out = _cli("cc", *common, "--set", f"sources.cc.val_tsv={val}", "--set", "sources.download.command=/no/img")
        assert out.returncode == 1 and "sources.download.command: /no/img is not an executable" in out.stderr
    assert not (tmp_path / "images").exists()
    # params that download cannot serve are bad params (exit 2, docs/safety.md), not the machine's state
    out = _cli("cc", "--set", "world=mini", "--set", f"paths.data={tmp_path / 'data'}")
    assert out.returncode == 2 and "world is mini" in out.stderr
    out = _cli("cc", *common, "--set", "sources.cc.val_tsv=null", "--set", "sources.cc.image_layout=sha1")
    assert out.returncode == 2 and "error: sources.cc.image_layout is sha1: download writes the img2dataset" \
        in out.stderr
    assert not (tmp_path / "images").exists()


@pytest.mark.slow
@needs_img2dataset
@pytest.mark.parametrize("dataset", ["cc", "sbu"])
def test_download_then_ingest(world, dataset):
    root, server, plans = world
    plan = plans[dataset]
    # a few images the server does not have, one it cuts short (img2dataset reads the Content-Length)
    served = [p for p in plan if p in server.files]
    gone, cut = served[:N_404], served[N_404]
    for p in gone:
        server.files.pop(p)
    server.truncated.add(cut)
    params = _params(root, dataset)
    counts = run(params, dataset)[0]
    expected_shards = -(-len(plan) // PER_SHARD)
    assert counts["urls"] == len(plan) and counts["shards"] == expected_shards > 1
    assert counts["successes"] == len(plan) - N_404 - 2  # and the world's planted missing image, the cut one

    image_root = Path(getattr(params.sources, dataset).image_root)
    shard = pq.read_table(image_root / "00000.parquet")
    assert shard.schema.remove_metadata().equals(SHARD_SCHEMA), shard.schema  # the mini world's copy is faithful
    meta = json.loads(next((image_root / "00000").glob("*.json")).read_text())
    assert list(meta) == SHARD_SCHEMA.names

    # ingest: against ingesting the mini world's own img2dataset layout, only the 404/cut rows move
    before = ingest_dataset(_params(root, dataset, served=False), dataset, progress=False)
    after = ingest_dataset(params, dataset, progress=False)
    assert after.rows_in == before.rows_in
    assert after.manifest_rows == before.manifest_rows - N_404 - 1
    assert after.rejects.get("missing_image", 0) == before.rejects.get("missing_image", 0) + N_404 + 1
    assert {k: v for k, v in after.rejects.items() if k != "missing_image"} == \
        {k: v for k, v in before.rejects.items() if k != "missing_image"}
    rejects = pq.read_table(after.rejects_path).to_pylist()
    by_url = {path: rej for rej in rejects for path in plan if server.base + path in rej["raw_row"]}
    for p in gone:
        assert by_url[p]["reason"] == "missing_image" and "HTTP Error 404: Not Found" in by_url[p]["detail"]
    assert by_url[cut]["reason"] == "missing_image" and "IncompleteRead" in by_url[cut]["detail"], by_url[cut]
    manifest = pq.read_table(after.manifest_path).to_pylist()
    for row in manifest:  # every kept row's file holds exactly the bytes the server sent for its URL
        path = row["url"].removeprefix(server.base)
        assert hashlib.sha256(Path(row["image_path"]).read_bytes()).digest() == \
            hashlib.sha256(server.files[path]).digest()

    # resuming: a shard without its _stats.json is downloaded again, and only that one
    (image_root / "00001_stats.json").unlink()
    server.requests.clear()
    counts = run(params, dataset)[0]
    assert counts["shards_resumed"] == expected_shards - 1
    requested = set(server.requests)
    shard1 = set(pq.read_table(image_root / "00001.parquet").column("url").to_pylist())
    assert shard1 <= {server.base + p for p in plan}
    assert requested == {u.removeprefix(server.base) for u in shard1}
    record = json.loads((image_root / RUN_FILE).read_text())
    assert record["counts"]["shards"] == expected_shards and (image_root / URL_LIST).exists()


@needs_img2dataset
def test_a_list_with_no_url_to_fetch_is_refused_before_anything_is_written(tmp_path):
    """Every line rejected by the reader's checks (no TAB, a bad URL, an empty file): img2dataset was
    run on an empty list and the stage exited 0 having fetched nothing."""
    tsv = tmp_path / "train.tsv"
    tsv.write_bytes(b"a caption without its url\n\thttp://example.com/1.jpg\nanother caption\tnot-a-url\n")
    out = _cli("cc", "--set", "world=real", "--set", f"sources.cc.image_root={tmp_path / 'images'}",
               "--set", f"sources.cc.train_tsv={tsv}", "--set", "sources.cc.val_tsv=null",
               "--set", f"sources.download.command={IMG2DATASET}", "--set", f"paths.data={tmp_path / 'data'}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"download@cc: no URL to fetch: the 3 lines of {tsv} were all rejected" in out.stderr
    assert "ingest cc" in out.stderr and not (tmp_path / "images").exists()


@pytest.mark.parametrize("damaged, said", [
    ("00000_stats.json", "not readable JSON (an interrupted run cut it short?): delete it"),
    ("_download/url_list.parquet", "not readable (Could not open Parquet input source"),
])
def test_a_damaged_file_of_an_earlier_download_is_named(tmp_path, damaged, said):
    """img2dataset writes a shard's _stats.json last and not atomically: a run killed then leaves it cut
    short, and a rerun stopped on a JSONDecodeError traceback; a damaged URL list, on an ArrowInvalid one."""
    from helpers.source_fixtures import partial_real_params, put_cc

    params, datasets = partial_real_params(tmp_path)
    images = put_cc(datasets, tmp_path / "scratch") / "images"
    (images / damaged).parent.mkdir(exist_ok=True)
    (images / damaged).write_text('{"count": ')
    out = _cli("cc", "--params", str(params), "--set", f"sources.download.command={sys.executable}")
    assert out.returncode == 1, out.stderr[-2000:]
    assert f"error: {images / damaged}: {said}" in out.stderr and "Traceback" not in out.stderr
