"""One progress policy for every stage: a bar on a terminal, a log line every 30 s elsewhere.

Under Airflow (or ``dvc repro > log``) stderr is not a terminal: a tqdm bar there either vanishes
(``disable=None``) or writes a carriage-return update ten times a second into the log. :func:`track`
is the project's only progress display and takes the tqdm arguments the stages use:

* stderr is a terminal: a tqdm bar, as before;
* otherwise: one ``pipeline`` logger line ``"<desc>: n/N, <rate> <unit>/s, eta <h:mm:ss>"`` at most
  every ``interval_s`` (30 s), and one ``"<desc>: n/N, <rate> <unit>/s, done in <h:mm:ss>"`` at the end.

``UNITER_PROGRESS=bar|lines|off`` forces a mode (``off``: nothing at all).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator, TextIO

ENV = "UNITER_PROGRESS"
MODES = ("bar", "lines", "off")
INTERVAL_S = 30.0
# every entry point's log line; ``tag`` (a fine-tuning start's name) goes after the logger's name
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s{tag}: %(message)s"


def configure_logging(tag: str = "") -> None:
    """INFO logging to stderr in the project's one line format (``tag``: e.g. ``"[scratch]"``)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT.format(tag=f" {tag}" if tag else ""))


def track(iterable: Iterable | None = None, *, total: float | None = None, desc: str = "", unit: str = "it",
          initial: float = 0, disable: bool = False, unit_scale: bool = False, file: TextIO | None = None,
          interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic,
          logger: logging.Logger | None = None, **bar_kwargs: Any) -> Any:
    """A progress display over ``iterable`` (or updated by hand): a tqdm bar or a :class:`LineProgress`.

    In: tqdm's arguments as the stages use them (``bar_kwargs`` such as ``mininterval``, ``leave``,
    ``dynamic_ncols`` only matter to the bar); ``disable`` shows nothing; ``file`` is the stream whose
    terminal-ness decides the mode (default stderr); ``clock``, ``logger`` and ``interval_s`` drive the
    log lines. Out: an object with ``n``, iteration, ``update``, ``set_postfix``, ``set_postfix_str``,
    ``close`` and ``with`` support, whichever the mode.
    """
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    mode = "off" if disable else choose_mode(file)
    if mode == "bar":
        from tqdm import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, unit_scale=unit_scale,
                    file=file, disable=False, **bar_kwargs)
    return LineProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, unit_scale=unit_scale,
                        interval_s=interval_s, clock=clock, logger=logger, quiet=mode == "off")


def choose_mode(file: TextIO | None = None) -> str:
    """``bar``, ``lines`` or ``off``: ``$UNITER_PROGRESS`` when set, else ``bar`` iff ``file`` (default stderr)
    is a terminal."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced:
        if forced not in MODES:
            raise ValueError(f"${ENV}: expected one of {', '.join(MODES)}, got {forced!r}")
        return forced
    stream = sys.stderr if file is None else file
    try:
        return "bar" if stream is not None and stream.isatty() else "lines"
    except (AttributeError, ValueError):  # no isatty, or a closed stream: not a terminal
        return "lines"


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` of a non-negative number of seconds (rounded down)."""
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class LineProgress:
    """tqdm's interface, reporting by log lines at most every ``interval_s`` (``quiet``: not at all).

    ``n`` counts from ``initial`` (a resumed run); the rate and eta count only what this run did.
    """

    def __init__(self, iterable: Iterable | None = None, *, total: float | None = None, desc: str = "",
                 unit: str = "it", initial: float = 0, unit_scale: bool = False, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, logger: logging.Logger | None = None,
                 quiet: bool = False) -> None:
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.n = self.initial = initial
        self.unit_scale, self.interval_s, self.clock, self.quiet = unit_scale, interval_s, clock, quiet
        self.log = logger or logging.getLogger("pipeline")
        self.start = self.last_line = clock()
        self.postfix = ""
        self.closed = False

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("LineProgress: nothing to iterate (no iterable given)")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:  # exhausted, or the loop broke / raised: the final line either way
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._finish(stopped=exc_type is not None)

    def update(self, n: float = 1) -> None:
        """Count ``n`` more; log a line when ``interval_s`` passed since the last one."""
        self.n += n
        now = self.clock()
        if not self.quiet and not self.closed and now - self.last_line >= self.interval_s:
            self.last_line = now
            self.log.info("%s", self.line(now))

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        """Values shown after the counts (``loss=0.123``) from the next line on."""
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """Text shown after the counts from the next line on."""
        self.postfix = str(s)

    def close(self) -> None:
        """Log the final line (once)."""
        self._finish(stopped=False)

    def _finish(self, *, stopped: bool) -> None:
        """The final line: ``done in`` or, when an exception left the ``with`` block, ``stopped after``."""
        if self.closed:
            return
        self.closed = True
        if not self.quiet:
            self.log.info("%s", self.line(self.clock(), done="stopped after" if stopped else "done in"))

    def line(self, now: float, *, done: str | None = None) -> str:
        """``"<desc>: n/N, <rate> <unit>/s, eta h:mm:ss"``; with ``done`` (``"done in"``) ``<done> h:mm:ss`` instead of
        the eta."""
        elapsed = max(now - self.start, 0.0)
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        count = f"{self._number(self.n)}/{self._number(self.total)}" if self.total is not None \
            else f"{self._number(self.n)} {self.unit}"
        parts = [count, f"{self._number(rate, rate=True)} {self.unit}/s"]
        if done:
            parts.append(f"{done} {format_duration(elapsed)}")
        elif self.total is not None:
            left = max(self.total - self.n, 0)
            parts.append(f"eta {format_duration(left / rate)}" if rate > 0 else "eta ?")
        text = f"{self.desc}: " if self.desc else ""
        return text + ", ".join(parts) + (f" ({self.postfix})" if self.postfix else "")

    def _number(self, value: float, *, rate: bool = False) -> str:
        """``value`` for a line: SI-scaled with ``unit_scale`` (``1.23M``), else an integer (rates: 2 decimals)."""
        if self.unit_scale:
            from tqdm import tqdm

            return tqdm.format_sizeof(value)
        if rate:
            return f"{value:.2f}"
        return f"{value:g}" if value != int(value) else str(int(value))
