"""What every reader yields (manifest :class:`Row` or :class:`Reject`) and the shared row checks.

A reader turns each raw row of its files into exactly one ``Row`` or one ``Reject``; the ingest
core (pipeline/ingest/ingest.py) then removes duplicate ids, checks images and writes both parquet files.
Checks return a :data:`Problem` ``(reason, detail)`` or None; reasons are the contract's reject
reasons (docs/design.md §5).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

from pipeline.common.progress import track
from pipeline.params.world import SourcesConfig

MISSING_CAPTION = "missing_caption"
MISSING_FIELD = "missing_field"
MALFORMED_ROW = "malformed_row"
BAD_URL = "bad_url"
NON_UTF8 = "non_utf8"
DUPLICATE_ID = "duplicate_id"
MISSING_IMAGE = "missing_image"
UNREADABLE_IMAGE = "unreadable_image"
TEXT_TOO_LONG = "text_too_long"
BAD_LABEL = "bad_label"
REASONS = (MISSING_CAPTION, MISSING_FIELD, MALFORMED_ROW, BAD_URL, NON_UTF8, DUPLICATE_ID,
           MISSING_IMAGE, UNREADABLE_IMAGE, TEXT_TOO_LONG, BAD_LABEL)

Problem = tuple[str, str]

# http(s)://[userinfo@]host[:port][/path?query#fragment] with a real host name or IPv6 literal and
# no whitespace/control characters anywhere. Stricter than urllib's urlsplit (which accepts
# "http:// host" and "http://" with an empty host) and ~5x faster on millions of rows.
URL_RE = re.compile(
    r"https?://(?:[^\s\x00-\x1f\x7f/?#@]*@)?"
    r"(?:[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?|\[[0-9a-f:.]+\])"
    r"(?::[0-9]*)?(?:[/?#][^\s\x00-\x1f\x7f]*)?\Z",
    re.IGNORECASE,
)


@dataclass(slots=True)
class Row:
    """One manifest row before the ingest core's duplicate and image checks.

    ``values`` holds every manifest column except ``dataset``; ``images`` lists the image files
    that must decode (the image, NLVR2's second image); ``aux_files`` lists other JSON files the
    example needs (VCR box metadata); ``key`` is an optional precomputed 64-bit hash of
    ``values["example_id"]`` (the core hashes it otherwise).
    """

    values: dict[str, Any]
    raw: Any
    source_file: str
    locator: str
    images: tuple[str, ...] = ()
    aux_files: tuple[str, ...] = ()
    key: int | None = None


@dataclass(slots=True)
class Reject:
    """A raw row that does not enter the manifest; ``raw`` is the original record (any JSON value,
    str or bytes) and becomes the ``raw_row`` text when written."""

    reason: str
    detail: str
    raw: Any
    source_file: str
    locator: str


@dataclass(frozen=True)
class ReadContext:
    """What a reader needs: where the files are and the text limits of ``params.ingest``."""

    sources: SourcesConfig
    min_text_chars: int = 1
    max_text_chars: int = 1000
    progress: bool | None = None  # False: none; None/True: pipeline.common.progress decides (bar or log lines)
    notes: dict[str, int] = field(default_factory=dict)  # reader-specific counts for _run.json

    def note(self, name: str, n: int = 1) -> None:
        self.notes[name] = self.notes.get(name, 0) + n

    def check_text(self, value: Any, name: str) -> Problem | None:
        """A caption / question / statement: a string, non-blank, not longer than the limit."""
        if value is None:
            return MISSING_CAPTION, f"{name} is null"
        if not isinstance(value, str):
            return MALFORMED_ROW, f"{name} should be a string, got {type(value).__name__}"
        text = value.strip()
        if len(text) < max(1, self.min_text_chars):
            detail = f"{name} is blank" if not text else f"{name} shorter than {self.min_text_chars} chars"
            return MISSING_CAPTION, detail
        if len(text) > self.max_text_chars:
            return TEXT_TOO_LONG, f"{name} has {len(text)} chars > max_text_chars {self.max_text_chars}"
        return None

    def bar(self, iterable=None, **kwargs) -> Any:
        return track(iterable, disable=self.progress is False, dynamic_ncols=True, leave=False, **kwargs)


def check_url(value: Any, name: str, *, nullable: bool = False) -> Problem | None:
    """An http(s) URL with a host; None is accepted only when ``nullable``."""
    if value is None:
        return None if nullable else (MISSING_FIELD, f"{name} is null")
    if not isinstance(value, str):
        return BAD_URL, f"{name} should be a string, got {type(value).__name__}"
    if URL_RE.match(value) is None:
        return BAD_URL, f"{name} is not an http(s) URL with a host: {value[:200]!r}"
    return None


def missing_keys(record: Any, keys: tuple[str, ...]) -> Problem | None:
    """malformed_row if ``record`` is not a JSON object; missing_field naming the absent keys."""
    if not isinstance(record, Mapping):
        return MALFORMED_ROW, f"expected a JSON object, got {type(record).__name__}"
    absent = [k for k in keys if k not in record]
    if absent:
        return MISSING_FIELD, "missing " + ", ".join(absent)
    return None


def check_int(record: Mapping[str, Any], name: str) -> Problem | None:
    """An integer id field (JSON numbers that are whole, within int64; booleans are not ids)."""
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        return MALFORMED_ROW, f"{name} should be an integer (int64), got {short_repr(value)}"
    return None


FLOAT32_MAX = 3.4028234663852886e38


def bad_number(value: Any, limit: float = FLOAT32_MAX) -> bool:
    """True unless ``value`` is an int or float (not a bool) of magnitude at most ``limit`` (NaN is bad)."""
    return isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) <= limit


def short_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters; safe for 5,000-digit ints and deep nesting."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"<a {type(value).__name__} too large or too deep to show>"
    return text if len(text) <= limit else text[:limit] + "..."


_SURROGATE_RE = re.compile("[\udc80-\udcff]")


def has_surrogates(text: str) -> bool:
    """True if ``text`` carries undecodable bytes (decoded with errors='surrogateescape')."""
    return _SURROGATE_RE.search(text) is not None


def record_has_surrogates(obj: Any) -> bool:
    """Walk a JSON value for strings (keys included) holding undecodable bytes."""
    if isinstance(obj, str):
        return has_surrogates(obj)
    if isinstance(obj, Mapping):
        return any(record_has_surrogates(k) or record_has_surrogates(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return any(record_has_surrogates(v) for v in obj)
    return False


def raw_text(raw: Any) -> str:
    """The ``raw_row`` text: bytes and undecodable characters shown as ``\\xNN`` escapes."""
    if isinstance(raw, bytes):
        return raw.decode("utf-8", errors="backslashreplace")
    if isinstance(raw, str):
        text = raw
    else:
        try:
            text = json.dumps(raw, ensure_ascii=False, default=repr)
        except (TypeError, ValueError, RecursionError):  # tuple keys from a pickle, a 5,000-digit int, deep nesting
            try:
                text = repr(raw)
            except (ValueError, RecursionError):
                text = f"<a {type(raw).__name__} too large or too deep to show>"
    if has_surrogates(text):
        text = text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="backslashreplace")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from a JSON escape: shown as \udXXX
            text = text.encode("utf-8", errors="backslashreplace").decode("utf-8")
    return text


class SourceFormatError(ValueError):
    """A whole source file is not in the shape its reader needs (not JSON, truncated, a wrong top
    level); the message names the file and where. The CLI reports it without a traceback (exit 2)."""


# What a document cut short leaves after the parse error: nothing, part of a literal or of a number
_CUT_LITERALS = ("true", "false", "null")
_CUT_NUMBER = re.compile(r"-|[.eE][+-]?")


def _looks_truncated(text: str, err: json.JSONDecodeError) -> bool:
    """True when the error is where a document cut short would fail: at the end of the text, in
    a string that runs to the end, or in a literal or number the end cuts off."""
    if err.msg.startswith("Unterminated string"):
        return True
    rest = text[err.pos:].rstrip()
    return not rest or any(word.startswith(rest) for word in _CUT_LITERALS) or bool(_CUT_NUMBER.fullmatch(rest))


def _json_error(path: Path, text: str, err: json.JSONDecodeError) -> SourceFormatError:
    """The error for ``text`` (the contents of ``path``) failing to parse: file, line, column,
    character offset and JSON's reason, and whether the file looks truncated or is empty."""
    where = f"line {err.lineno} column {err.colno} (char {err.pos})"
    # "Unterminated string starting at" (json's wording) refers to the position given before it
    message = f"{path}: not valid JSON at {where}: {err.msg.removesuffix(' starting at')}"
    if not text.strip():
        message += "; the file is empty"
    elif _looks_truncated(text, err):
        message += f"; the file looks truncated (it ends at char {len(text)})"
    return SourceFormatError(message)


class OutOfRangeNumber:
    """A JSON number no field can hold: more digits than Python converts (4,300), or a float
    beyond double range (``1e400``). Parsed as this marker instead of failing the whole file, so
    the one row holding it is rejected by its reader's type checks (it is neither int nor float)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text if len(self.text) <= 40 else f"{self.text[:20]}...({len(self.text)} chars)"


def _parse_int(text: str) -> Any:
    return int(text) if len(text) <= 4300 else OutOfRangeNumber(text)


def _parse_float(text: str) -> Any:
    value = float(text)
    return value if value not in (float("inf"), float("-inf")) else OutOfRangeNumber(text)


def parse_json(text: str) -> Any:
    """``json.loads`` with numbers out of range as :class:`OutOfRangeNumber` (``NaN``/``Infinity``
    literals stay floats, as the readers' range checks expect). RecursionError: nesting deeper
    than the parser goes."""
    return json.loads(text, parse_int=_parse_int, parse_float=_parse_float)


# the first bytes of a compressed file (a source kept as downloaded, or packed under its own name);
# none is UTF-8 text a source could start with (bz2's "BZh9" is followed by its block magic)
COMPRESSED = {"gzip": re.compile(rb"\x1f\x8b"), "bz2": re.compile(rb"BZh[1-9]1AY&SY"),
              "xz": re.compile(rb"\xfd7zXZ\x00"), "zstd": re.compile(rb"\x28\xb5\x2f\xfd"),
              "zip": re.compile(rb"PK\x03\x04")}
HEAD_BYTES = 10  # enough for every magic above


def refuse_compressed(path: Path, head: bytes) -> None:
    """SourceFormatError when ``head`` (the first bytes of ``path``) starts like a compressed file:
    read as text it would become a few undecodable rows, not the file's rows."""
    for kind, magic in COMPRESSED.items():
        if magic.match(head):
            raise SourceFormatError(f"{path}: {kind}-compressed; decompress it and point sources at the "
                                    "decompressed file")


def load_json(path: Path) -> tuple[Any, bool]:
    """Load a single-document JSON file; returns (document, clean).

    A file with bytes that are not UTF-8 still loads (decoded with ``surrogateescape``) and
    ``clean`` is False, so readers can reject just the records that carry such bytes.
    Raises :class:`SourceFormatError` (see :func:`_json_error`) when it is not valid JSON, or
    nests deeper than the JSON parser goes (the one case a single row can fail a whole file).
    """
    data = Path(path).read_bytes()
    refuse_compressed(path, data[:HEAD_BYTES])
    try:
        text, clean = data.decode("utf-8-sig"), True
    except UnicodeDecodeError:
        text, clean = data.decode("utf-8", errors="surrogateescape"), False
    try:
        return parse_json(text), clean
    except json.JSONDecodeError as err:
        raise _json_error(path, text, err) from None
    except RecursionError:
        raise SourceFormatError(f"{path}: nested deeper than the JSON parser goes (Python's recursion limit "
                                f"{sys.getrecursionlimit()}); the file cannot be read as one document") from None


_JSON_TYPES = {dict: "dict", list: "list", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def expect_list(doc: Any, path: Path, key: str | None = None) -> list:
    """``doc[key]`` (or ``doc``) as a list, or SourceFormatError naming the file, the key and what
    the file holds instead (another file's top level, an object without the key)."""
    if key is not None and not isinstance(doc, Mapping):
        raise SourceFormatError(f"{path}: expected a JSON object with a list at '{key}', got a "
                                f"{_JSON_TYPES.get(type(doc), type(doc).__name__)}")
    if key is not None and key not in doc:
        keys = ", ".join(short_repr(k, 40).strip("'") for k in list(doc)[:10]) or "none"
        raise SourceFormatError(f"{path}: expected a JSON object with a list at '{key}', it has no key '{key}' "
                                f"(its keys: {keys})")
    value = doc if key is None else doc[key]
    if not isinstance(value, list):
        where = f"'{key}'" if key else "the top level"
        raise SourceFormatError(f"{path}: expected a list at {where}, got a "
                                f"{_JSON_TYPES.get(type(value), type(value).__name__)}")
    return value


UTF8_BOM = b"\xef\xbb\xbf"


def skip_bom(fh: BinaryIO) -> BinaryIO:
    """``fh`` (a file opened ``rb``) past a UTF-8 byte order mark at its start, if it has one: an
    editor's or spreadsheet's "UTF-8 text" begins with one, which is no part of line 1's text.
    Raises SourceFormatError for a compressed file (:func:`refuse_compressed`)."""
    head = fh.read(HEAD_BYTES)
    refuse_compressed(Path(fh.name), head)
    fh.seek(len(UTF8_BOM) if head.startswith(UTF8_BOM) else 0)
    return fh


def iter_lines(path: Path, ctx: ReadContext, desc: str) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line bytes without the line ending) of a file (a leading UTF-8 byte order
    mark left out), with a byte progress bar."""
    path = Path(path)
    with path.open("rb") as fh, ctx.bar(total=path.stat().st_size, unit="B", unit_scale=True, desc=desc) as bar:
        lineno = 0
        for lineno, line in enumerate(skip_bom(fh), 1):
            if not lineno & 0xFFFF:
                bar.update(fh.tell() - bar.n)
            yield lineno, line.rstrip(b"\r\n")
        bar.update(fh.tell() - bar.n)


def decode_line(line: bytes) -> str | None:
    """The line as UTF-8 text, or None when it is not valid UTF-8."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _json_array_start(text: str) -> bool:
    """True when line 1 of a JSON-lines file is the start of a JSON array (the records saved as one
    document): a ``[`` that does not parse on its own, or a list of objects (a row never is one)."""
    if not text.lstrip().startswith("["):
        return False
    try:
        value = parse_json(text)
    except (json.JSONDecodeError, RecursionError):
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def jsonl_records(path: Path, ctx: ReadContext, desc: str) -> Iterator[tuple[str, dict, bytes] | Reject]:
    """Parse a JSON-lines file line by line: yields (locator, record, line bytes) or a Reject for a
    line that is not UTF-8 (``non_utf8``), empty, not JSON or not an object (``malformed_row``).
    Raises SourceFormatError for a file that is one JSON array instead (every row would be lost)."""
    source = str(path)
    for lineno, line in iter_lines(path, ctx, desc):
        locator = f"line {lineno}"
        text = decode_line(line)
        if lineno == 1 and text is not None and _json_array_start(text):
            raise SourceFormatError(f"{path}: a JSON array, expected JSON lines (one object a line)")
        if text is None:
            yield Reject(NON_UTF8, "line is not valid UTF-8", line, source, locator)
            continue
        if not text.strip():
            yield Reject(MALFORMED_ROW, "empty line", line, source, locator)
            continue
        try:
            record = parse_json(text)
        except json.JSONDecodeError as err:
            yield Reject(MALFORMED_ROW, f"invalid JSON: {err}", line, source, locator)
            continue
        except RecursionError:
            yield Reject(MALFORMED_ROW, "nested deeper than the JSON parser goes", line, source, locator)
            continue
        if not isinstance(record, dict):
            yield Reject(MALFORMED_ROW, f"expected a JSON object, got {type(record).__name__}", line, source,
                         locator)
            continue
        yield locator, record, line
