"""URL identity: canonical URLs and Flickr photo ids (pure functions, no I/O).

Two URLs that name the same resource should compare equal after :func:`canonical_url`; two Flickr
URLs (or file names) of the same photo give the same :func:`flickr_photo_id` whatever the host,
farm, server path, secret or size suffix. Decontamination (pipeline/decontam/decontaminate.py) uses both
as identity keys; ``pipeline/decontam/url_vec.py`` is the vectorized twin and must agree with these
functions on every input.

Canonical form (RFC 3986 section 6.2.2 syntax-based normalization, plus query sorting):

- surrounding whitespace stripped; a string without ``scheme://authority`` is returned as is
- scheme and host lower-cased; an empty or default port (http 80, https 443, ftp 21, ws 80,
  wss 443) dropped; other ports written without leading zeros
- percent-encoding normalized: escapes of unreserved characters (``A-Z a-z 0-9 - . _ ~``)
  decoded, every other escape written with upper-case hex; characters that may not appear
  literally (space, non-ASCII, a lone ``%``) percent-encoded as UTF-8
- dot segments (``.`` and ``..``) resolved after decoding; an empty path becomes ``/``
- query parameters (split on ``&``) sorted, empty ones dropped, an empty query dropped
- fragment dropped
"""

from __future__ import annotations

import re

__all__ = ["canonical_url", "flickr_photo_id", "remove_dot_segments", "normalize_percent_encoding"]

# RFC 3986 appendix B: never fails, splits any string into its five components.
_URI = re.compile(r"^(?:([^:/?#]+):)?(?://([^/?#]*))?([^?#]*)(?:\?([^#]*))?(?:#(.*))?$", re.DOTALL)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*$")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ftp": 21, "ws": 80, "wss": 443}

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_SUB_DELIMS = frozenset("!$&'()*+,;=")
# characters that may stay literal in each component (everything else is percent-encoded)
_PATH_SAFE = _UNRESERVED | _SUB_DELIMS | frozenset(":@/")
_QUERY_SAFE = _PATH_SAFE | frozenset("?")
_USERINFO_SAFE = _UNRESERVED | _SUB_DELIMS | frozenset(":")

def _escape_pattern(safe: frozenset[str]) -> re.Pattern:
    """Matches what normalization may change: an escape ``%XX`` or one character outside ``safe``."""
    chars = "".join(sorted(safe)).replace("\\", "\\\\").replace("]", "\\]").replace("^", "\\^").replace("-", "\\-")
    return re.compile(r"%[0-9A-Fa-f]{2}|[^" + chars + "]", re.DOTALL)


def _fix_escape(match: re.Match) -> str:
    text = match.group(0)
    if len(text) == 3:  # %XX
        decoded = chr(int(text[1:], 16))
        return decoded if decoded in _UNRESERVED else text.upper()
    # a lone '%' or a character that may not appear literally: its UTF-8 bytes, escaped
    return "".join(f"%{b:02X}" for b in text.encode("utf-8", "surrogatepass"))


_ESCAPES: dict[frozenset[str], re.Pattern] = {}


def normalize_percent_encoding(text: str, safe: frozenset[str]) -> str:
    """Normalize the percent-encoding of one URL component.

    ``%XX`` of an unreserved character is decoded, any other ``%XX`` gets upper-case hex; a ``%``
    not followed by two hex digits becomes ``%25``; characters outside ``safe`` are encoded as
    their UTF-8 bytes. The result is a fixed point: normalizing it again changes nothing.
    """
    pattern = _ESCAPES.get(safe)
    if pattern is None:
        pattern = _ESCAPES[safe] = _escape_pattern(safe)
    return pattern.sub(_fix_escape, text)


def remove_dot_segments(path: str) -> str:
    """Resolve ``.`` and ``..`` segments of a path (RFC 3986 section 5.2.4).

    >>> remove_dot_segments("/a/b/c/./../../g")
    '/a/g'
    """
    segments = path.split("/")
    absolute = path.startswith("/")
    out: list[str] = []
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == ".":
            if last:
                out.append("")  # "/a/." -> "/a/"
        elif seg == "..":
            if len(out) > (1 if absolute else 0):
                out.pop()
            if last:
                out.append("")
        else:
            out.append(seg)
    result = "/".join(out)
    if absolute and not result.startswith("/"):
        result = "/" + result
    return result


def _split_port(hostport: str) -> tuple[str, str | None]:
    """(host, port digits) of ``host[:port]``; port None when there is none (or it is not numeric)."""
    if hostport.startswith("[") and "]" in hostport:  # IPv6 literal: a port may follow the bracket
        close = hostport.index("]")
        host, colon, port = hostport[: close + 1], hostport[close + 1 : close + 2] == ":", hostport[close + 2 :]
    else:
        host, colon, port = hostport.rpartition(":")
    if colon and (port == "" or port.isascii() and port.isdigit()):
        return host, port
    return hostport, None


def _split_authority(authority: str, scheme: str) -> str:
    """Lower-case the host, drop an empty or default port, normalize userinfo escapes."""
    userinfo, at, hostport = authority.rpartition("@")
    while True:
        host, port = _split_port(hostport)
        if port != "":
            break
        hostport = host  # an empty port ("host:") is dropped; what remains may end in a port again
    host = host.lower()
    if port:
        number = int(port)
        port = None if _DEFAULT_PORTS.get(scheme) == number else str(number)
    result = host if not port else f"{host}:{port}"
    if at:
        result = normalize_percent_encoding(userinfo, _USERINFO_SAFE) + "@" + result
    return result


def canonical_url(url: str) -> str:
    """The canonical form of ``url`` (see the module docstring for the rules).

    Pure and idempotent: ``canonical_url(canonical_url(u)) == canonical_url(u)``. A string that is
    not a ``scheme://authority...`` URL comes back stripped and otherwise unchanged.

    >>> canonical_url("HTTP://Example.COM:80/a/./b/../c%7e?b=2&a=1#top")
    'http://example.com/a/c~?a=1&b=2'
    """
    text = url.strip()
    match = _URI.match(text)
    scheme, authority, path, query = match.group(1), match.group(2), match.group(3), match.group(4)
    if scheme is None or authority is None or not _SCHEME.match(scheme):
        return text
    scheme = scheme.lower()
    authority = _split_authority(authority, scheme)
    path = remove_dot_segments(normalize_percent_encoding(path, _PATH_SAFE)) or "/"
    result = f"{scheme}://{authority}{path}"
    if query is not None:
        params = sorted(p for p in (normalize_percent_encoding(q, _QUERY_SAFE) for q in query.split("&")) if p)
        if params:
            result += "?" + "&".join(params)
    return result


# --------------------------------------------------------------------------------------------
# Flickr photo ids

# Static image hosts. c{N}.staticflickr.com paths carry the farm as an extra first segment.
FLICKR_STATIC_HOSTS = r"(?:farm[0-9]+\.static\.flickr\.com|farm[0-9]+\.staticflickr\.com|live\.staticflickr\.com|c[0-9]+\.staticflickr\.com|static\.flickr\.com)"
# Matched against a *canonical* URL (lower-case scheme/host, default port gone, dots resolved).
# Group `id` is the photo id without leading zeros; a secret and a size suffix are optional.
FLICKR_STATIC_PATTERN = (
    r"^https?://" + FLICKR_STATIC_HOSTS + r"(?::[0-9]+)?/(?:[0-9]+/)?[0-9]+/0*(?P<id>[0-9]+)"
    r"(?:_[0-9A-Za-z]+){0,2}\.(?:jpg|jpeg|png|gif|JPG|JPEG|PNG|GIF)(?:\?[^#]*)?$"
)
# Photo pages: https://www.flickr.com/photos/<user>/<id>[/...]
FLICKR_PAGE_PATTERN = r"^https?://(?:www\.|m\.)?flickr\.com/photos/[^/?#]+/0*(?P<id>[0-9]+)(?:[/?].*)?$"
# Short links: https://flic.kr/p/<base58 id>
FLICKR_SHORT_PATTERN = r"^https?://(?:www\.)?flic\.kr/p/(?P<id>[1-9A-HJ-NP-Za-km-z]+)/?$"

_FLICKR_STATIC = re.compile(FLICKR_STATIC_PATTERN)
_FLICKR_PAGE = re.compile(FLICKR_PAGE_PATTERN)
_FLICKR_SHORT = re.compile(FLICKR_SHORT_PATTERN)
_FILENAME_ID = re.compile(r"^0*([0-9]+)\.(?:jpe?g|png)$", re.IGNORECASE)
_BARE_ID = re.compile(r"^0*([0-9]+)$")
_BASE58 = "123456789abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"


def _base58_decode(text: str) -> str:
    value = 0
    for ch in text:
        value = value * 58 + _BASE58.index(ch)
    return str(value)


def flickr_photo_id_from_url(url: str) -> str | None:
    """The photo id of a Flickr static-image, photo-page or flic.kr URL; None for other URLs."""
    canon = canonical_url(url)
    for pattern in (_FLICKR_STATIC, _FLICKR_PAGE):
        match = pattern.match(canon)
        if match:
            return match.group(1)
    match = _FLICKR_SHORT.match(canon)
    return _base58_decode(match.group(1)) if match else None


def flickr_photo_id(url_or_filename: str | None) -> str | None:
    """The numeric Flickr photo id named by a URL, a file name, or a bare id; None if there is none.

    Accepts every Flickr URL form (``farm{N}.static.flickr.com``, ``farm{N}.staticflickr.com``,
    ``live.staticflickr.com``, ``c{N}.staticflickr.com`` with the farm in the path, with or
    without secret and size suffix, http or https, any case, ports, query strings), photo pages
    (``flickr.com/photos/<user>/<id>``), ``flic.kr/p/<base58>`` short links, Flickr30k file names
    (``1000092795.jpg``, optionally with a directory) and bare ids such as VG's ``flickr_id``.
    Leading zeros are dropped, so equal ids compare equal as strings.

    >>> flickr_photo_id("https://live.staticflickr.com/65535/2970773875_164f0c0b83_z.jpg")
    '2970773875'
    """
    if url_or_filename is None:
        return None
    text = url_or_filename.strip()
    if "://" in text:
        return flickr_photo_id_from_url(text)
    match = _BARE_ID.match(text) or _FILENAME_ID.match(text.replace("\\", "/").rsplit("/", 1)[-1])
    return match.group(1) if match else None
