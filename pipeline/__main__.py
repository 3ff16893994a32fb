"""``python -m pipeline <stage> [ITEM] [--params params.yaml] [--set a.b=value ...]``.

The single entry used identically by DVC (``dvc.yaml``), Airflow (``dags/``) and people. Each stage
runs holding its output lock (:mod:`pipeline.common.locking`): a second run of the same stage waits for the
first, or exits with status 3 when ``UNITER_LOCK_WAIT=0``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from model.weights_file import force_weights_only_loads
from pipeline.common.exiting import exit_now
from pipeline.common.malloc import keep_freed_memory
from pipeline.common.openmp import set_stage_wait_policy
from pipeline.common.progress import configure_logging
from pipeline.common.runinfo import stage_clock
from pipeline.stages import STAGES, TOOLS, resolve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline",
        description="uniter-pipeline stages. Each reads params.yaml strictly; --set overrides a key.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="stages:\n"
        + "\n".join(f"  {s.name:<15} {s.help}" + (f" (ITEM = {s.item})" if s.item else "") for s in STAGES.values())
        + "\n\ntools:\n"
        + "\n".join(f"  {s.name:<15} {s.help}" for s in TOOLS.values())
        + "\n\nA stage waits while another run of it writes the same outputs; UNITER_LOCK_WAIT=0 exits "
          "with status 3 instead (N: wait at most N seconds).",
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
    force_weights_only_loads()  # nothing a stage loads may run code, whichever library calls torch.load
    set_stage_wait_policy()  # before the stage's imports load torch (and libgomp)
    try:
        keep_freed_memory()  # a training step's large buffers are reused, not faulted in again each step
    except ValueError as err:  # a misspelt UNITER_MALLOC
        print(f"error: {err}", file=sys.stderr)
        return 2
    parser = build_parser()
    if not argv:
        parser.print_help()
        return 0
    if argv[0] in TOOLS:
        return _reported(lambda: int(resolve(TOOLS[argv[0]].entry)(argv[1:]) or 0))
    args = parser.parse_args(argv)
    configure_logging()
    from pipeline.params.parser import ParamsError, load_params

    try:
        # only the inputs this command reads: `ingest cc` runs on a machine that holds CC alone
        params = load_params(args.params, args.overrides, check_paths=STAGES[args.command].check_paths,
                             command=args.command, item=getattr(args, "item", None))
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from pipeline.params.pretrain import PRETRAIN_OUTPUTS
    from pipeline.common.locking import stage_locks, wait_from_env

    try:
        wait = wait_from_env()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stage = STAGES[args.command]
    item = args.item if stage.item else None
    # one writer per output: a retry or a second terminal waits here (or exits 3) instead of
    # racing the running one; see pipeline/common/locking.py for the keys
    out_name = params.pretrain.out_name if args.command in PRETRAIN_OUTPUTS else None

    def locked_run() -> int:
        if item is not None and stage.check_item:  # a bad ITEM is refused before a lock file is named after it
            resolve(stage.check_item)(params, item)
        with stage_locks(params.paths.data, args.command, item, out_name=out_name, wait=wait):
            _run_stage(stage, params, item)
        return 0

    return _reported(locked_run, data_dir=params.paths.data)


def _reported(run, data_dir=None) -> int:
    """``run()``'s status; an anticipated error (pipeline/common/failures.py: bad params or input,
    an unsafe file, a foreign directory, a full disk, a busy lock) becomes one ``error:`` line and
    its documented exit status instead of a traceback."""
    from pipeline.common.failures import describe

    try:
        return run()
    except Exception as err:
        known = describe(err, data_dir=data_dir)
        if known is None:
            raise  # a bug: keep the traceback
        status, message = known
        print(f"error: {message}", file=sys.stderr)
        return status


def _run_stage(stage, params, item: str | None) -> None:
    """Import the stage's module and call its entry (with ITEM for item stages); logs the wall time."""
    func = resolve(stage.entry)
    with stage_clock() as start:  # the stage's _run.json wall times count from here
        if stage.item:
            func(params, item)
        else:
            func(params)
    logging.getLogger("pipeline").info("%s finished in %.1fs", stage.name, time.time() - start)


if __name__ == "__main__":
    # the stage has closed its outputs: skip finalizing torch & co. (~1.5 s a process)
    exit_now(main())
