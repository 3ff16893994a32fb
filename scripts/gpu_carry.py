"""Build ``.gpu_carry/site``: the packages `make gpu-check` needs that a GPU host without the venv lacks.

    .venv/bin/python scripts/gpu_carry.py            # -> .gpu_carry/site (+ .gpu_carry/manifest.json)

GPU hosts without the venv (docs/gpu.md) hold their own Python 3.12 with a CUDA
build of torch, numpy and a few hundred common packages, cannot reach a package index, and take
the working tree plus named extra folders. This script finds what the check imports and the
machine lacks, by running the check's own code paths here: ``bench/gpu_check.py --dry`` and one
short CPU round of ``bench/pretrain.py --world synthetic``, in this process, then reading
``sys.modules``. Each missing top-level package is put in ``.gpu_carry/site``:

- pure Python (no compiled module in it): copied from this venv's site-packages (its version is
  the pinned one; Python 3.11 source runs on 3.12);
- compiled: its CPython 3.12 manylinux wheel of the same version, fetched with ``pip download``
  from the registries pip is configured with, and unpacked.

On the GPU machine: ``export PYTHONPATH=$PWD/.gpu_carry/site`` and run the check with ``python3``.
``manifest.json`` lists each package, its version and how it came.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as md
import io
import json
import runpy
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Packages the GPU image provides (its package list, the import names this
# check touches): taken from there, never carried, so torch and numpy stay the CUDA image's builds.
DEVICE_HAS = {
    "torch", "torchvision", "triton", "numpy", "scipy", "PIL", "yaml", "tqdm", "packaging", "filelock",
    "fsspec", "jinja2", "markupsafe", "sympy", "mpmath", "networkx", "typing_extensions", "psutil",
    "requests", "urllib3", "certifi", "idna", "charset_normalizer", "six", "dateutil", "pandas",
    "pyarrow", "safetensors", "tokenizers", "transformers", "huggingface_hub", "regex", "msgpack",
    "einops", "cv2", "matplotlib", "tabulate", "portalocker", "py_cpuinfo", "cpuinfo", "pydantic_settings",
    "google", "cuda", "nvidia", "rich", "pygments", "markdown_it", "mdurl", "click", "attrs", "attr",
    "cloudpickle", "colorama", "pyparsing", "cycler", "kiwisolver", "fontTools", "contourpy", "tensorboard",
    "protobuf", "hf_xet", "xxhash", "zipp", "setuptools", "pkg_resources", "_distutils_hack", "wheel",
    "pip", "absl", "grpc", "sklearn", "joblib", "threadpoolctl", "skimage", "imageio", "tifffile",
    "lazy_loader", "h5py", "ml_dtypes", "opt_einsum", "wrapt", "pytest", "_pytest", "pluggy", "iniconfig",
    "functorch", "torchgen", "pynvml",  # torch's own and nvidia-ml-py's: the image's builds
    "typer", "shellingham", "anyio", "sniffio", "h11", "httpx", "httpcore", "annotated_doc", "humanize",
}


def imported_top_level() -> set[str]:
    """Top-level modules imported by the check's dry run and a CPU round of the pretraining bench."""
    argv = sys.argv
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        for script, args in (("bench/gpu_check.py", ["--dry", "--out", f"{tmp}/gpu_check.json"]),
                             ("bench/pretrain.py", ["--world", "synthetic", "--steps", "2", "--rounds", "1"])):
            sys.argv = [script, *args]
            try:
                runpy.run_path(str(REPO / script), run_name="__main__")
            except SystemExit as e:
                if e.code not in (0, None):
                    raise SystemExit(f"gpu_carry: {script} {' '.join(args)} exited with {e.code}") from None
            finally:
                sys.argv = argv
    return {name.split(".")[0] for name in list(sys.modules)}


def site_packages_module(name: str) -> Path | None:
    """The file or folder of top-level module ``name`` in this venv's site-packages, else None."""
    site = Path(sysconfig.get_paths()["purelib"])
    for cand in (site / name, site / f"{name}.py"):
        if cand.exists():
            return cand
    hits = sorted(site.glob(f"{name}.*.so")) or sorted(site.glob(f"{name}.*.pyd"))
    return hits[0] if hits else None


def distribution_of(name: str, providers: dict[str, list[str]]) -> md.Distribution:
    """The installed distribution of top-level module ``name``; ``providers``: ``md.packages_distributions()``."""
    dists = providers.get(name)
    if not dists:
        raise SystemExit(f"gpu_carry: no installed distribution provides module {name!r}")
    return md.distribution(dists[0])


def is_compiled(path: Path) -> bool:
    if path.is_file():
        return path.suffix in (".so", ".pyd")
    return any(path.rglob("*.so"))


def fetch_cp312_wheel(dist: str, version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--dest", str(dest)]
    for n in (17, 27, 28, 31, 34):
        cmd += ["--platform", f"manylinux_2_{n}_x86_64"]
    cmd += ["--platform", "manylinux2014_x86_64", f"{dist}=={version}"]
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"gpu_carry: expected one wheel for {dist}=={version}, got {wheels}")
    return wheels[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / ".gpu_carry")
    args = ap.parse_args(argv)
    stdlib = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    local = {"pipeline", "model", "bench", "dags", "tests", "__main__", "__mp_main__"}
    wanted = sorted(n for n in imported_top_level() - stdlib - local - DEVICE_HAS
                    if not n.startswith("__"))  # __editable__ finders: this checkout's own install
    site = args.out / "site"
    shutil.rmtree(args.out, ignore_errors=True)
    site.mkdir(parents=True)
    manifest = []
    providers = md.packages_distributions()  # one scan of every installed distribution, not one per module
    for name in wanted:
        path = site_packages_module(name)
        if path is None:  # a module of the stdlib's extension folder or an alias: nothing to carry
            continue
        dist = distribution_of(name, providers)
        entry = {"module": name, "distribution": dist.metadata["Name"], "version": dist.version}
        if is_compiled(path):
            with tempfile.TemporaryDirectory() as tmp:
                wheel = fetch_cp312_wheel(entry["distribution"], dist.version, Path(tmp))
                with zipfile.ZipFile(wheel) as zf:
                    members = [m for m in zf.namelist() if m.split("/")[0].split(".")[0] == name
                               or m.split("/")[0].endswith(".libs")]
                    zf.extractall(site, members)
                entry["how"] = f"wheel {wheel.name}"
        elif path.is_dir():
            shutil.copytree(path, site / name, ignore=shutil.ignore_patterns("__pycache__"))
            entry["how"] = "copied"
        else:
            shutil.copy2(path, site / path.name)
            entry["how"] = "copied"
        manifest.append(entry)
        print(f"{name:24s} {entry['distribution']}=={entry['version']}  {entry['how']}")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    print(f"{len(manifest)} packages, {size / 2**20:.1f} MiB in {site}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
