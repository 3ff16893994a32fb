"""``python -m pipeline db inspect PATH --key ID`` and ``python -m pipeline db stats PATH``.

inspect: one record's fields with dtype and shape (arrays) or value (scalars, short lists); for
text DBs also the decoded text of every id field. stats: counts, truncation and drop counts, and
length histograms (text tokens from ``id2len.json``, regions from ``nbb.json``), as rich tables.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from rich.console import Console
from rich.table import Table

from pipeline.stores.readers import ImageDb, TextDb, open_db

ID_FIELDS = ("input_ids", "choices", "answer_choices")


def describe(value: Any) -> tuple[str, str, str]:
    """(type, shape, preview) of one record field."""
    if isinstance(value, np.ndarray):
        flat = value.reshape(-1)
        preview = np.array2string(flat[:8], precision=3, separator=", ") + (" ..." if flat.size > 8 else "")
        return value.dtype.name, str(tuple(value.shape)), preview
    if isinstance(value, list):
        if value and all(isinstance(v, np.ndarray) for v in value):
            shapes = ", ".join(str(tuple(v.shape)) for v in value)
            return f"list[{value[0].dtype.name}]", f"{len(value)} x [{shapes}]", ""
        return "list", f"({len(value)},)", repr(value[:6]) + (" ..." if len(value) > 6 else "")
    return type(value).__name__, "", repr(value)


def _decoder(db: TextDb):
    from pipeline.stores.tokenization import WordPieceTokenizer

    try:
        tok = WordPieceTokenizer(db.meta["tokenizer"])
    except (FileNotFoundError, ValueError) as err:
        reason = str(err)  # ``err`` is unbound once the except block ends; the lambda runs later
        return lambda ids: f"(cannot decode: {reason})"
    return lambda ids: tok.decode([int(i) for i in ids])


def inspect_record(path: Path, key: str, console: Console) -> int:
    db = open_db(path)
    try:
        record = db[key]
    except KeyError as err:
        console.print(f"[red]error:[/red] {err.args[0]}")
        return 1
    table = Table(title=f"{db.meta['kind']} DB {db.name!r}  key {key!r}")
    for col in ("field", "dtype", "shape", "value"):
        table.add_column(col, overflow="fold")
    for name in sorted(record):
        table.add_row(name, *describe(record[name]))
    console.print(table)
    if isinstance(db, ImageDb):
        console.print(f"regions: {db.nbb.get(key)}  feature_dim: {db.feature_dim}  classes (C+1): {db.num_classes}")
        return 0
    decode = _decoder(db)
    for name in ID_FIELDS:
        if name not in record:
            continue
        values = record[name] if isinstance(record[name], list) else [record[name]]
        for k, ids in enumerate(values):
            label = name if len(values) == 1 and not isinstance(record[name], list) else f"{name}[{k}]"
            console.print(f"[bold]{label}[/bold]: {decode(ids)}")
    console.print(f"image_ids: {record.get('image_ids')}  (image DBs: {db.meta['img_db']}, "
                  f"layout {db.meta['image_layout']})")
    return 0


def histogram(values: Sequence[int], bins: int = 10) -> Table:
    arr = np.asarray(list(values), dtype=np.int64)
    table = Table(show_header=True)
    for col in ("range", "count", ""):
        table.add_column(col)
    if arr.size == 0:
        return table
    counts, edges = np.histogram(arr, bins=min(bins, max(1, int(arr.max() - arr.min()) + 1)))
    top = max(int(counts.max()), 1)
    for c, lo, hi in zip(counts, edges[:-1], edges[1:]):
        table.add_row(f"{lo:.0f}-{hi:.0f}", str(int(c)), "█" * int(round(30 * c / top)))
    return table


def stats(path: Path, console: Console) -> int:
    db = open_db(path)
    summary = Table(title=f"{db.meta['kind']} DB {db.name!r} ({path})", show_header=False)
    summary.add_column("key")
    summary.add_column("value", overflow="fold")
    if isinstance(db, ImageDb):
        nbb = np.asarray(list(db.nbb.values()))
        rows = [("images", len(nbb)), ("regions", int(nbb.sum())), ("regions/image mean", f"{nbb.mean():.2f}"),
                ("feature_dim", db.feature_dim), ("classes (C+1)", db.num_classes), ("mode", db.meta.get("mode")),
                ("size on disk", f"{(path / 'data.mdb').stat().st_size / 2**20:.2f} MiB")]
        lengths, what = db.nbb.values(), "regions per image"
    else:
        lens = np.asarray(list(db.id2len.values()))
        rows = [("examples", len(lens)), ("task / split", f"{db.meta['task']} / {db.meta['split']}"),
                ("images", len({i for ids in db.txt2img.values() for i in ids})), ("image DBs", db.meta["img_db"]),
                ("tokens mean / max", f"{lens.mean():.2f} / {lens.max()}"), ("max_txt_len", db.meta["max_txt_len"]),
                ("truncated", db.meta["truncated"]), ("dropped", db.meta["dropped"]),
                ("tokenizer", db.meta["tokenizer"])]
        lengths, what = db.id2len.values(), "text tokens per example"
    for k, v in rows:
        summary.add_row(k, str(v))
    console.print(summary)
    console.print(f"[bold]{what}[/bold]")
    console.print(histogram(list(lengths)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline db", description="inspect LMDB image/text stores")
    sub = parser.add_subparsers(dest="command", required=True)
    p_inspect = sub.add_parser("inspect", help="show one record")
    p_inspect.add_argument("path", type=Path)
    p_inspect.add_argument("--key", required=True, help="image id (image DB) or example id (text DB)")
    p_stats = sub.add_parser("stats", help="counts and length histograms")
    p_stats.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    console = Console(width=120)
    if not (args.path / "meta.json").is_file():
        console.print(f"[red]error:[/red] {args.path} is not a DB directory (no meta.json)")
        return 2
    if args.command == "inspect":
        return inspect_record(args.path, args.key, console)
    return stats(args.path, console)
