"""``python -m pipeline uniter_ckpt export|inspect``: UNITER release files out of and into the pipeline.

export: a pretraining export (``data/models/<name>/``, the first stage or the VCR second stage)
    -> a UNITER release file with the reference's key names and shapes, beside it
    ``<name>.config.json`` (the reference's ``--model_config``) and ``<name>.export.json`` (what the
    format cannot say about this model; docs/real-data.md). ``--dtype fp16`` writes half precision
    as the authors' files are.
inspect: a release file's sha256, dtypes, shape and preset, heads and notes, and the params lines
    that start the first pretraining stage from it (``model.uniter_checkpoint``).

Bad input exits with status 2 and writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

DTYPES = ("fp32", "fp16")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline uniter_ckpt",
        description="UNITER release files out of and into the pipeline (docs/real-data.md)")
    sub = parser.add_subparsers(dest="action", required=True)
    export = sub.add_parser("export", help="a pretraining export -> a UNITER release file")
    export.add_argument("--model", type=Path, default=Path("data/models/pretrain"),
                        help="export directory of a pretraining stage (default: data/models/pretrain)")
    export.add_argument("--out", type=Path, required=True, help="the release file to write, e.g. uniter-mini.pt")
    export.add_argument("--dtype", choices=DTYPES, default="fp32", help="floating dtype in the file (default fp32)")
    inspect = sub.add_parser("inspect", help="what a UNITER release file holds, and its params lines")
    inspect.add_argument("file", type=Path)
    return parser


def export(model_dir: Path, out: Path, dtype: str) -> dict:
    """Write ``out`` from ``model_dir``; returns the notes. Raises UniterFormatError / FileNotFoundError."""
    import torch

    from model.uniter_format import to_uniter
    from model.weights_file import UniterFormatError
    from pipeline.training.model_io import read_exported
    from pipeline.training.uniter_ckpt import write_release

    meta, state = read_exported(model_dir)
    if "num_classes" not in meta or "img_dim" not in meta:
        raise UniterFormatError(f"{model_dir}: not a pretraining export (model_config.json has no img_dim / "
                                "num_classes; a fine-tuned task model has no UNITER release format)")
    try:
        to_uniter(state)  # every key must have a place before anything is written
    except UniterFormatError as err:
        raise UniterFormatError(f"{model_dir}: {err}") from None
    if out.resolve().parent == model_dir.resolve():
        raise UniterFormatError(f"--out {out}: inside {model_dir}, a stage output DVC replaces; write it elsewhere")
    return write_release(state, meta, out, dtype={"fp32": torch.float32, "fp16": torch.float16}[dtype],
                         source=str(model_dir))


def inspect(path: Path) -> None:
    from pipeline.training.uniter_ckpt import read_release

    release = read_release(path)
    shape = release.shape
    print(f"file:    {path}")
    print(f"sha256:  {release.sha256}")
    print(f"keys:    {len(release.state)} ({', '.join(release.dtypes)})")
    print(f"shape:   {shape.describe()}, {shape.type_vocab_size} segment types, "
          f"{shape.max_position_embeddings} positions, MRC classes {shape.num_classes}")
    print(f"heads:   {', '.join(shape.heads) or 'none'}")
    if release.notes is not None:
        print(f"written by `uniter_ckpt export` from {release.notes.get('source')}; model {release.notes['model']}")
        for note in release.notes.get("departures", []):
            print(f"  note: {note}")
    print("params (model: section) to start the first pretraining stage from it:")
    print(f"  preset: {shape.preset}")
    print(f"  uniter_checkpoint: {path}")
    print(f"  uniter_checkpoint_sha256: {release.sha256}")
    for key, value in release.forward_settings().items():
        print(f"  {key}: {value}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from model.weights_file import UniterFormatError, UnsafeCheckpointError

    try:
        if args.action == "export":
            notes = export(args.model, args.out, args.dtype)
            print(f"wrote {args.out} ({notes['keys']} keys, {notes['dtype']}, sha256 {notes['sha256']})")
            for note in notes["departures"]:
                print(f"  note: {note}")
        else:
            inspect(args.file)
    except (UniterFormatError, UnsafeCheckpointError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
