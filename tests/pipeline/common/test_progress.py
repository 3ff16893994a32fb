"""pipeline.common.progress: a tqdm bar on a terminal; elsewhere a log line at most every interval,
and one at the end."""

from __future__ import annotations

import logging
import os
import select

import pytest
from tqdm import tqdm

from pipeline.common.progress import ENV, LineProgress, choose_mode, format_duration, track


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class NotATerminal:
    def isatty(self) -> bool:
        return False


@pytest.fixture(autouse=True)
def no_forced_mode(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "pipeline"]


def test_lines_mode_logs_at_most_one_line_per_interval_and_a_final_one(caplog):
    clock = FakeClock()
    caplog.set_level(logging.INFO, logger="pipeline")
    bar = track(total=100, desc="extract coco", unit="img", file=NotATerminal(), clock=clock)
    assert isinstance(bar, LineProgress)
    for _ in range(50):  # 50 images, one a second: lines at 30 s only (not at 1..29 or 31..50)
        clock.now += 1.0
        bar.update(1)
    assert _lines(caplog) == ["extract coco: 30/100, 1.00 img/s, eta 0:01:10"]
    clock.now += 0.5
    bar.update(10)  # the interval counts from the last line, not from the start
    assert len(_lines(caplog)) == 1
    clock.now += 30
    bar.update(0)
    assert _lines(caplog)[-1] == "extract coco: 60/100, 0.75 img/s, eta 0:00:53"
    bar.close()
    bar.close()  # once only
    assert _lines(caplog)[-1] == "extract coco: 60/100, 0.75 img/s, done in 0:01:20"
    assert len(_lines(caplog)) == 3


def test_iterating_counts_each_item_and_ends_with_a_line(caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    clock = FakeClock()
    seen = []
    for item in track(range(5), desc="phash", file=NotATerminal(), clock=clock):
        clock.now += 20
        seen.append(item)
    assert seen == [0, 1, 2, 3, 4]
    # 20 s per item and a 30 s interval: lines after items 2 and 4 (40 s, 80 s), then the final one
    assert _lines(caplog) == ["phash: 2/5, 0.05 it/s, eta 0:01:00", "phash: 4/5, 0.05 it/s, eta 0:00:20",
                              "phash: 5/5, 0.05 it/s, done in 0:01:40"]


def test_a_resumed_run_rates_only_its_own_steps_and_shows_the_postfix(caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    clock = FakeClock()
    with track(total=1000, initial=900, desc="pretrain", unit="step", file=NotATerminal(), clock=clock,
               mininterval=2.0, dynamic_ncols=True) as bar:  # bar-only arguments are accepted and ignored
        clock.now += 3600
        bar.set_postfix(loss="1.234", task="mlm", refresh=False)
        bar.update(50)
    assert _lines(caplog) == ["pretrain: 950/1000, 0.01 step/s, eta 1:00:00 (loss=1.234, task=mlm)",
                              "pretrain: 950/1000, 0.01 step/s, done in 1:00:00 (loss=1.234, task=mlm)"]


def test_an_exception_in_the_with_block_ends_with_stopped_after(caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    clock = FakeClock()
    with pytest.raises(KeyboardInterrupt):
        with track(total=10, desc="extract vg", unit="shard", file=NotATerminal(), clock=clock) as bar:
            clock.now += 4
            bar.update(2)
            raise KeyboardInterrupt
    assert _lines(caplog) == ["extract vg: 2/10, 0.50 shard/s, stopped after 0:00:04"]


def test_unknown_totals_and_scaled_units(caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    clock = FakeClock()
    rows = track(iter(range(3)), desc="image DB coco", unit="img", file=NotATerminal(), clock=clock)
    clock.now += 2
    assert list(rows) == [0, 1, 2]
    size = track(total=4_000_000, desc="cc", unit="B", unit_scale=True, file=NotATerminal(), clock=clock)
    clock.now += 40
    size.update(2_000_000)
    assert _lines(caplog) == ["image DB coco: 3 img, 1.50 img/s, done in 0:00:02",
                              "cc: 2.00M/4.00M, 50.0k B/s, eta 0:00:40"]


def test_disable_and_off_show_nothing_but_still_count(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="pipeline")
    bar = track(total=3, desc="x", disable=True, interval_s=0)
    bar.update(2)
    bar.close()
    assert bar.n == 2 and not _lines(caplog)
    monkeypatch.setenv(ENV, "off")
    assert list(track(range(3), desc="y", interval_s=0)) == [0, 1, 2]
    assert not _lines(caplog)


def test_the_environment_forces_a_mode_and_a_bad_value_names_the_variable(monkeypatch):
    class Terminal:
        def isatty(self) -> bool:
            return True

    assert choose_mode(Terminal()) == "bar" and choose_mode(NotATerminal()) == "lines"
    monkeypatch.setenv(ENV, "lines")
    assert choose_mode(Terminal()) == "lines"
    monkeypatch.setenv(ENV, "BAR")
    assert choose_mode(NotATerminal()) == "bar"
    monkeypatch.setenv(ENV, "fancy")
    with pytest.raises(ValueError, match=r"\$UNITER_PROGRESS: expected one of bar, lines, off, got 'fancy'"):
        choose_mode(NotATerminal())


def test_a_terminal_gets_a_tqdm_bar(caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as stream:
            bar = track(range(3), desc="decode", unit="img", file=stream)
            assert isinstance(bar, tqdm)
            assert list(bar) == [0, 1, 2]
            stream.flush()
        out = b""
        while select.select([master], [], [], 1.0)[0]:
            chunk = os.read(master, 4096)
            out += chunk
            if b"3/3" in out or not chunk:
                break
    finally:
        os.close(master)
        os.close(slave)
    text = out.decode(errors="replace")
    assert "decode:" in text and "3/3" in text and "|" in text  # the bar itself, not a log line
    assert not _lines(caplog)


def test_durations_read_hours_minutes_seconds():
    assert [format_duration(s) for s in (0, 59.9, 61, 3600 * 27 + 5)] == ["0:00:00", "0:00:59", "0:01:01", "27:00:05"]


@pytest.mark.parametrize("tag, name_part", [("", "pipeline.x: "), ("[scratch]", "pipeline.x [scratch]: ")])
def test_every_entry_point_logs_one_line_format(tag, name_part):
    """configure_logging (stage processes, tools, the fine-tuning start processes): time, level,
    logger, the optional tag, then the message, on stderr."""
    import re
    import subprocess
    import sys

    code = ("from pipeline.common.progress import configure_logging; import logging; "
            f"configure_logging({tag!r}); logging.getLogger('pipeline.x').info('hello')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO " + re.escape(name_part) + "hello\n", proc.stderr)
