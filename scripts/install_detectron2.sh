#!/usr/bin/env bash
# Install detectron2 v0.6 into the venv of the given python, for real and reproducibly.
#
#   bash scripts/install_detectron2.sh .venv/bin/python
#
# detectron2 is not on the package index under its own name. `pb1-detectron2==0.6` is an sdist
# of detectron2 v0.6 without its C++ sources (docs/design.md §15). We download that sdist with pip
# (the pip cache makes this fast), patch the unpacked tree, and build it with torch already
# present (--no-build-isolation) and without extension modules: the Faster R-CNN C4 models of
# this project need none (ROIAlign and NMS come from torchvision). Patches, each checked so a
# changed sdist fails loudly instead of installing half-patched:
#   - setup.py: no ext_modules; package the model-zoo configs that ship inside
#     detectron2/model_zoo/configs (the original globbed a top-level configs/ dir that the sdist
#     lacks); runtime requirements reduced to what is pinned in requirements.txt.
#   - `from detectron2 import _C` (deformable/rotated ops, fast COCO eval) becomes optional:
#     those ops raise a clear error if used, everything else imports.
#   - Pillow >= 10 removed Image.LINEAR (-> Image.BILINEAR).
#   - setuptools >= 81 removed pkg_resources (model_zoo.get_config_file -> importlib.resources).
#   - NumPy >= 1.24 removed np.bool / np.int / np.float (-> builtins).
# A marker line in detectron2/__init__.py records the patch level; when it is already installed
# at this level the script exits in well under a second without importing torch.
set -euo pipefail

PY="${1:-.venv/bin/python}"
SDIST_NAME="pb1-detectron2"
SDIST_VERSION="0.6"
PATCH_LEVEL="uniter-1"

if ! "$PY" -c 'import sys' 2>/dev/null; then
    echo "install_detectron2: no python at $PY" >&2
    exit 2
fi

installed_level() {
    "$PY" - <<'EOF'
import importlib.util, pathlib
spec = importlib.util.find_spec("detectron2")
if spec is None or spec.origin is None:
    print("none")
else:
    for line in pathlib.Path(spec.origin).read_text().splitlines():
        if line.startswith("__uniter_patch__"):
            print(line.split("=", 1)[1].strip().strip("'\""))
            break
    else:
        print("unpatched")
EOF
}

if [[ "$(installed_level)" == "$PATCH_LEVEL" ]]; then
    echo "install_detectron2: detectron2 $SDIST_VERSION ($PATCH_LEVEL) already installed"
    exit 0
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

echo "install_detectron2: fetching $SDIST_NAME==$SDIST_VERSION (sdist)"
"$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
    "$SDIST_NAME==$SDIST_VERSION" -d "$WORK/dl"
tar -xzf "$WORK/dl/$SDIST_NAME-$SDIST_VERSION.tar.gz" -C "$WORK"
SRC="$WORK/$SDIST_NAME-$SDIST_VERSION"

echo "install_detectron2: patching $SRC"
"$PY" - "$SRC" "$PATCH_LEVEL" <<'EOF'
import pathlib, re, sys

src, level = pathlib.Path(sys.argv[1]), sys.argv[2]


def patch(rel, old, new, count=1):
    """Replace ``old`` by ``new`` in file ``rel``; the sdist must contain ``old`` exactly ``count`` times."""
    path = src / rel
    text = path.read_text()
    found = text.count(old)
    if found != count:
        sys.exit(f"install_detectron2: {rel}: expected {count}x {old!r}, found {found}")
    path.write_text(text.replace(old, new))


# setup.py: pure-python build, model-zoo configs packaged, requirements that match our pins.
patch("setup.py", "ext_modules=get_extensions(),", "ext_modules=[],")
patch("setup.py", 'package_data={"detectron2.model_zoo": get_model_zoo_configs()},',
      'package_data={"detectron2.model_zoo": ["configs/**/*.yaml", "configs/**/*.py"]},')
setup_py = (src / "setup.py").read_text()
start = setup_py.index("    install_requires=[")
end = setup_py.index("    ],\n", start) + len("    ],\n")
requires = ["Pillow>=7.1", "matplotlib", "pycocotools>=2.0.2", "termcolor>=1.1", "yacs>=0.1.8",
            "tabulate", "cloudpickle", "tqdm>4.29.0", "fvcore>=0.1.5,<0.1.6", "iopath>=0.1.7",
            "omegaconf>=2.1"]
(src / "setup.py").write_text(setup_py[:start] + f"    install_requires={requires!r},\n" + setup_py[end:])

# The compiled ops are optional: importing them no longer needs detectron2._C.
optional_c = (
    "try:\n"
    "    from detectron2 import _C\n"
    "except ImportError:  # built without extension modules (scripts/install_detectron2.sh)\n"
    "    _C = None\n"
)
for rel in ("detectron2/layers/deform_conv.py", "detectron2/layers/rotated_boxes.py",
            "detectron2/layers/roi_align_rotated.py", "detectron2/evaluation/fast_eval_api.py"):
    patch(rel, "from detectron2 import _C\n", optional_c)

# Pillow >= 10.
patch("detectron2/data/transforms/transform.py", "interp=Image.LINEAR", "interp=Image.BILINEAR")

# setuptools without pkg_resources.
patch("detectron2/model_zoo/model_zoo.py", "import pkg_resources\n", "import importlib.resources\n")
patch("detectron2/model_zoo/model_zoo.py",
      'cfg_file = pkg_resources.resource_filename(\n        "detectron2.model_zoo", os.path.join("configs", config_path)\n    )',
      'cfg_file = str(importlib.resources.files("detectron2.model_zoo").joinpath("configs", config_path))')

# NumPy >= 1.24 removed the deprecated scalar aliases.
alias = re.compile(r"\bnp\.(bool|int|float|object)\b(?!_|\d)")
for path in sorted((src / "detectron2").rglob("*.py")):
    text = path.read_text()
    new = alias.sub(lambda m: m.group(1), text)
    if new != text:
        path.write_text(new)

# Patch level marker read by the fast path of this script.
init = src / "detectron2/__init__.py"
init.write_text(init.read_text() + f'__uniter_patch__ = "{level}"\n')
EOF

echo "install_detectron2: building and installing (no extension modules)"
"$PY" -m pip install -q --no-deps --no-build-isolation --force-reinstall "$SRC"

"$PY" - <<'EOF'
import os
import detectron2
from detectron2 import model_zoo
from detectron2.config import get_cfg
from detectron2.modeling import build_model

cfg_file = model_zoo.get_config_file("COCO-Detection/faster_rcnn_R_50_C4_1x.yaml")
assert os.path.exists(cfg_file), cfg_file
cfg = get_cfg()
cfg.merge_from_file(cfg_file)
print(f"install_detectron2: detectron2 {detectron2.__version__} ({detectron2.__uniter_patch__}) ok")
EOF
