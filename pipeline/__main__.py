"""``python -m pipeline <stage> [ITEM] [--params params.yaml] [--set a.b=value ...]``.

The single entry used identically by DVC (``dvc.yaml``), Airflow (``dags/``) and people.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from pipeline.stages import STAGES, TOOLS, resolve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline",
        description="uniter-pipeline stages. Each reads params.yaml strictly; --set overrides a key.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="stages:\n"
        + "\n".join(f"  {s.name:<15} {s.help}" + (f" (ITEM = {s.item})" if s.item else "") for s in STAGES.values())
        + "\n\ntools:\n"
        + "\n".join(f"  {s.name:<15} {s.help}" for s in TOOLS.values()),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for stage in STAGES.values():
        p = sub.add_parser(stage.name, help=stage.help, description=stage.help)
        if stage.item:
            p.add_argument("item", nargs="?", default=None, metavar=stage.item.upper(),
                           help=f"the {stage.item} to run (default: all)")
        p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override one params key, e.g. --set pretrain.steps=10 (repeatable)")
    for tool in TOOLS.values():
        p = sub.add_parser(tool.name, help=tool.help, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:
        parser.print_help()
        return 0
    if argv[0] in TOOLS:
        return int(resolve(TOOLS[argv[0]].entry)(argv[1:]) or 0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pipeline.config import ParamsError, load_params

    try:
        params = load_params(args.params, args.overrides)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stage = STAGES[args.command]
    func = resolve(stage.entry)
    start = time.time()
    if stage.item:
        func(params, args.item)
    else:
        func(params)
    logging.getLogger("pipeline").info("%s finished in %.1fs", args.command, time.time() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
