"""URLs as they appear in the real files: Flickr static forms, COCO urls, web image URLs, and the
spelling variants of one URL that decontamination has to see through (docs/design.md §3, §7).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

FLICKR_SIZES = ("m", "n", "z", "c", "b", "o", "q", "t", "s")
WEB_HOSTS = ("i.pinimg.example", "cdn.newsroom.example", "static.blogpics.example", "images.stockhouse.example",
             "media.shopfront.example", "upload.wikimedia.example")
FORMS = ("farm_static", "farm_staticflickr", "live", "static")


@dataclass(frozen=True)
class FlickrPhoto:
    """The identity of one Flickr photo; URLs of it differ in host, farm, secret and size."""

    photo_id: int
    server: int
    farm: int
    secret: str


class PhotoIds:
    """Allocates Flickr photo ids that are unique across the whole world (collisions would be
    unplanned overlaps)."""

    def __init__(self) -> None:
        self.used: set[int] = set()

    def new(self, rng: np.random.Generator) -> FlickrPhoto:
        while True:
            pid = int(rng.integers(1_000_000_000, 9_999_999_999))
            if pid not in self.used:
                self.used.add(pid)
                return FlickrPhoto(pid, int(rng.integers(1000, 9999)), int(rng.integers(1, 10)), hex_token(rng, 10))


def hex_token(rng: np.random.Generator, n: int) -> str:
    return "".join("0123456789abcdef"[int(v)] for v in rng.integers(0, 16, size=n))


def flickr_url(photo: FlickrPhoto, form: str, *, size: str | None = None, secret: str | None = None,
               https: bool | None = None) -> str:
    """One Flickr static URL of ``photo``. ``form`` in FORMS; ``live`` always has a size suffix."""
    sec = secret or photo.secret
    if form == "live":
        size = size or "z"
    suffix = f"_{size}" if size else ""
    name = f"{photo.server}/{photo.photo_id}_{sec}{suffix}.jpg"
    if form == "farm_static":
        scheme = "https" if https else "http"
        return f"{scheme}://farm{photo.farm}.static.flickr.com/{name}"
    if form == "farm_staticflickr":
        scheme = "http" if https is False else "https"
        return f"{scheme}://farm{photo.farm}.staticflickr.com/{name}"
    if form == "live":
        return f"https://live.staticflickr.com/{name}"
    if form == "static":
        scheme = "https" if https else "http"
        return f"{scheme}://static.flickr.com/{name}"
    raise ValueError(f"unknown Flickr URL form {form!r}")


def flickr_variant(rng: np.random.Generator, photo: FlickrPhoto, avoid_form: str | None) -> tuple[str, str]:
    """Another URL of the same photo (other form/host/farm/size/secret/scheme) -> (url, description)."""
    forms = [f for f in FORMS if f != avoid_form]
    form = forms[int(rng.integers(len(forms)))]
    size = str(rng.choice(FLICKR_SIZES)) if (form == "live" or rng.random() < 0.6) else None
    other_secret = rng.random() < 0.4
    secret = hex_token(rng, 10) if other_secret else None
    https = bool(rng.random() < 0.5)
    url = flickr_url(photo, form, size=size, secret=secret, https=https)
    host = url.split("/")[2]
    parts = [url.split(":")[0], host, f"size suffix _{size}" if size else "no size suffix"]
    desc = "+".join(parts + (["other secret"] if other_secret else []))
    return url, desc


def original_url(rng: np.random.Generator, photo: FlickrPhoto) -> str:
    """The photo's original-size URL as Flickr serves it today: ``live.staticflickr.com/65535``,
    an ``_o`` suffix and the original's own secret (not the one of the sized URLs)."""
    return f"https://live.staticflickr.com/65535/{photo.photo_id}_{hex_token(rng, 10)}_o.jpg"


def coco_url(split: str, file_name: str) -> str:
    return f"http://images.cocodataset.org/{split}/{file_name}"


def web_url(rng: np.random.Generator, *, with_query: bool = False) -> str:
    """A plain web image URL on a made-up host (never a Flickr photo)."""
    host = WEB_HOSTS[int(rng.integers(len(WEB_HOSTS)))]
    path = f"{hex_token(rng, 2)}/{hex_token(rng, 2)}/{hex_token(rng, 16)}.jpg"
    url = f"https://{host}/{path}"
    if with_query:
        url += f"?w={int(rng.integers(200, 900))}&h={int(rng.integers(200, 900))}&fit=crop"
    return url


_UNRESERVED_SAFE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_~-"


def url_variant(rng: np.random.Generator, url: str, kind: str) -> str:
    """The same resource spelled differently (what canonicalization must undo).

    kind: upper_host (scheme and host upper-case), default_port (:80 / :443), dot_segments
    (``./`` and ``x/../``), fragment (``#...``), query_order (query parameters reordered),
    percent_encoding (%-encoded unreserved characters in the path).
    """
    scheme, rest = url.split("://", 1)
    host, _, path = rest.partition("/")
    query = ""
    if "?" in path:
        path, query = path.split("?", 1)
    if kind == "upper_host":
        scheme, host = scheme.upper(), host.upper()
    elif kind == "default_port":
        host = host + (":443" if scheme == "https" else ":80")
    elif kind == "dot_segments":
        parts = path.split("/")
        parts.insert(len(parts) - 1, ".")
        parts.insert(0, "tmp")
        parts.insert(1, "..")
        path = "/".join(parts)
    elif kind == "fragment":
        path = path + ("?" + query if query else "") + f"#{hex_token(rng, 6)}"
        return f"{scheme}://{host}/{path}"
    elif kind == "query_order":
        params = query.split("&")
        if len(params) < 2:
            raise ValueError(f"query_order needs a URL with >= 2 query parameters: {url}")
        query = "&".join(params[1:] + params[:1])
    elif kind == "percent_encoding":
        chars = list(path)
        candidates = [k for k, ch in enumerate(chars) if ch in _UNRESERVED_SAFE]
        for k in sorted(rng.choice(candidates, size=min(3, len(candidates)), replace=False).tolist()):
            chars[k] = "%{:02X}".format(ord(chars[k]))
        path = "".join(chars)
    else:
        raise ValueError(f"unknown URL variant {kind!r}")
    return f"{scheme}://{host}/{path}" + (f"?{query}" if query else "")


def sha1_key(url: str) -> str:
    """The downloaded-image file key of a CC/SBU URL: sha1 of its UTF-8 bytes (docs/design.md §3)."""
    return hashlib.sha1(url.encode("utf-8")).hexdigest()
