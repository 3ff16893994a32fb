"""URL canonicalization and Flickr photo ids: examples, RFC 3986 references, and properties.

The vectorized twin (pipeline/decontam/url_vec.py) is checked against the scalar functions on the same
inputs, so the stage and the benchmark can rely on identical keys.
"""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.decontam.url_vec import canonical_urls, flickr_photo_ids_from_canonical, url_keys
from pipeline.decontam.urls import (
    canonical_url,
    flickr_photo_id,
    flickr_photo_id_from_url,
    normalize_percent_encoding,
    remove_dot_segments,
)

UNRESERVED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # case of scheme and host; the path keeps its case
        ("HTTP://Example.COM/Path/File.JPG", "http://example.com/Path/File.JPG"),
        ("hTTpS://WWW.Example.com", "https://www.example.com/"),
        # default ports dropped, others kept without leading zeros; empty port dropped
        ("http://example.com:80/a", "http://example.com/a"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("http://example.com:443/a", "http://example.com:443/a"),
        ("https://example.com:80/a", "https://example.com:80/a"),
        ("http://example.com:08080/a", "http://example.com:8080/a"),
        ("http://example.com:/a", "http://example.com/a"),
        ("ftp://example.com:21/file", "ftp://example.com/file"),
        # dot segments
        ("http://example.com/a/./b/../c", "http://example.com/a/c"),
        ("http://example.com/../../a", "http://example.com/a"),
        ("http://example.com/a/b/..", "http://example.com/a/"),
        ("http://example.com/a/.", "http://example.com/a/"),
        ("http://example.com/a/%2E%2E/b", "http://example.com/b"),
        ("http://example.com/a/%2e/b", "http://example.com/a/b"),
        ("http://example.com/a..b/.c/", "http://example.com/a..b/.c/"),
        # fragment dropped
        ("http://example.com/a#frag", "http://example.com/a"),
        ("http://example.com/a?x=1#frag?y=2", "http://example.com/a?x=1"),
        # query sorted, empty parameters and empty query dropped; '+' is not a space
        ("http://example.com/a?b=2&a=1", "http://example.com/a?a=1&b=2"),
        ("http://example.com/a?b=2&&a=1&", "http://example.com/a?a=1&b=2"),
        ("http://example.com/a?", "http://example.com/a"),
        ("http://example.com/a?q=a+b", "http://example.com/a?q=a+b"),
        ("http://example.com/a?a=2&a=1", "http://example.com/a?a=1&a=2"),
        ("http://example.com/a?x=%2a&y=%7e", "http://example.com/a?x=%2A&y=~"),
        # percent-encoding: unreserved decoded, the rest upper-case hex, unsafe characters encoded
        ("http://example.com/%7euser/%41%62c", "http://example.com/~user/Abc"),
        ("http://example.com/a%2fb", "http://example.com/a%2Fb"),
        ("http://example.com/a%2Fb", "http://example.com/a%2Fb"),
        ("http://example.com/a b", "http://example.com/a%20b"),
        ("http://example.com/caf\u00e9.jpg", "http://example.com/caf%C3%A9.jpg"),
        ("http://example.com/100%", "http://example.com/100%25"),
        ("http://example.com/%zz", "http://example.com/%25zz"),
        ("http://example.com/a%20b", "http://example.com/a%20b"),
        ("http://example.com/a\"<>`{}|\\^", "http://example.com/a%22%3C%3E%60%7B%7D%7C%5C%5E"),
        # userinfo and IPv6 literals
        ("http://User:P%61ss@Example.com:80/", "http://User:Pass@example.com/"),
        ("http://[2001:DB8::1]:80/a", "http://[2001:db8::1]/a"),
        ("http://[2001:DB8::1]:8080/a", "http://[2001:db8::1]:8080/a"),
        # surrounding whitespace; non-URLs come back stripped and untouched
        ("  http://example.com/a \n", "http://example.com/a"),
        ("example.com/a b", "example.com/a b"),
        ("/relative/../path", "/relative/../path"),
        ("mailto:someone@example.com", "mailto:someone@example.com"),
        ("", ""),
        # real dataset URL shapes
        ("http://images.cocodataset.org/val2014/COCO_val2014_000000391895.jpg",
         "http://images.cocodataset.org/val2014/COCO_val2014_000000391895.jpg"),
        ("https://i.pinimg.com/736x/9a/2b/AB.jpg?w=600&h=400&crop=1",
         "https://i.pinimg.com/736x/9a/2b/AB.jpg?crop=1&h=400&w=600"),
    ],
)
def test_canonical_url_examples(url, expected):
    assert canonical_url(url) == expected
    assert canonical_url(expected) == expected


def _rfc_remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4, written as the RFC's input/output buffer loop (independent reference)."""
    inp, out = path, ""
    while inp:
        if inp.startswith("../"):
            inp = inp[3:]
        elif inp.startswith("./"):
            inp = inp[2:]
        elif inp.startswith("/./"):
            inp = "/" + inp[3:]
        elif inp == "/.":
            inp = "/"
        elif inp.startswith("/../"):
            inp = "/" + inp[4:]
            out = out[: out.rfind("/")] if "/" in out else ""
        elif inp == "/..":
            inp = "/"
            out = out[: out.rfind("/")] if "/" in out else ""
        elif inp in (".", ".."):
            inp = ""
        else:
            start = 1 if inp.startswith("/") else 0
            end = inp.find("/", start)
            end = len(inp) if end < 0 else end
            out += inp[:end]
            inp = inp[end:]
    return out


@pytest.mark.parametrize(
    ("path", "expected"),
    [("/a/b/c/./../../g", "/a/g"), ("mid/content=5/../6", "mid/6"), ("/", "/"), ("/..", "/"), ("/a/..", "/"),
     ("/a//../b", "/a/b"), ("/a/b/../../..", "/"), ("/./a/./", "/a/")],
)
def test_remove_dot_segments_rfc_examples(path, expected):
    assert remove_dot_segments(path) == expected == _rfc_remove_dot_segments(path)


@settings(deadline=None)
@given(st.lists(st.sampled_from(["a", "b", ".", "..", "", "c.d", "..e", "f.."]), max_size=8))
def test_remove_dot_segments_matches_the_rfc_algorithm(segments):
    # absolute paths only: a URL with an authority has an empty or absolute path
    path = "/" + "/".join(segments)
    assert remove_dot_segments(path) == _rfc_remove_dot_segments(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("%41%7e%2d", "A~-"), ("%2f%3a%3F", "%2F%3A%3F"), ("%", "%25"), ("%4", "%254"), ("%%41", "%25A"),
     ("\u00fc", "%C3%BC"), ("\U0001f600", "%F0%9F%98%80")],
)
def test_normalize_percent_encoding(text, expected):
    safe = frozenset(UNRESERVED + "/")
    assert normalize_percent_encoding(text, safe) == expected


# --------------------------------------------------------------------------------------------
# Flickr photo ids

PHOTO = "2970773875"


@pytest.mark.parametrize(
    "value",
    [
        f"http://farm4.static.flickr.com/3153/{PHOTO}_164f0c0b83.jpg",
        f"http://farm4.static.flickr.com/3153/{PHOTO}_164f0c0b83_m.jpg",
        f"https://farm4.staticflickr.com/3153/{PHOTO}_164f0c0b83_z.jpg",
        f"http://farm66.staticflickr.com/65535/{PHOTO}_abcdef0123_b.jpg",
        f"https://live.staticflickr.com/3153/{PHOTO}_164f0c0b83_b.jpg",
        f"https://live.staticflickr.com/3153/{PHOTO}_164f0c0b83.jpg",
        f"https://live.staticflickr.com/3153/{PHOTO}_9a8b7c6d5e_o.png",
        f"https://c1.staticflickr.com/4/3153/{PHOTO}_164f0c0b83_c.jpg",
        f"https://c8.staticflickr.com/4/3153/{PHOTO}_164f0c0b83.jpg",
        f"http://static.flickr.com/3153/{PHOTO}_164f0c0b83.jpg",
        f"https://farm4.staticflickr.com/3153/{PHOTO}.jpg",  # no secret
        f"HTTPS://FARM4.STATICFLICKR.COM:443/3153/{PHOTO}_164f0c0b83_z.jpg#x",
        f"http://farm4.staticflickr.com/3153/./{PHOTO}_164f0c0b83_z.jpg?zz=1",
        f"  http://farm4.staticflickr.com/3153/00{PHOTO}_164f0c0b83.JPG ",
        f"https://www.flickr.com/photos/someone/{PHOTO}/",
        f"https://www.flickr.com/photos/someone/{PHOTO}/in/photostream",
        f"https://flickr.com/photos/12345678@N00/{PHOTO}",
        f"{PHOTO}.jpg",
        f"flickr30k-images/{PHOTO}.jpg",
        f"/data/flickr30k/flickr30k-images/{PHOTO}.JPG",
        PHOTO,
        f" 0{PHOTO} ",
    ],
)
def test_flickr_photo_id_of_every_form(value):
    assert flickr_photo_id(value) == PHOTO


@pytest.mark.parametrize(
    "value",
    [
        None, "", "http://example.com/2970773875_164f0c0b83.jpg", "https://farm4.staticflickr.com.evil.com/1/2_3.jpg",
        "http://images.cocodataset.org/val2014/COCO_val2014_000000391895.jpg",
        "https://live.staticflickr.com/3153/notanid_164f.jpg", "https://www.flickr.com/photos/someone/",
        "COCO_train2014_000000057870.jpg", "12ab.jpg", "https://live.staticflickr.com/3153/2970773875_a.jpg/more",
    ],
)
def test_flickr_photo_id_rejects_non_flickr(value):
    assert flickr_photo_id(value) is None


def _base58_encode(number: int) -> str:
    alphabet = "123456789abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"
    out = ""
    while number:
        number, rem = divmod(number, 58)
        out = alphabet[rem] + out
    return out or alphabet[0]


@settings(deadline=None)
@given(st.integers(min_value=1, max_value=10**12))
def test_flic_kr_short_links_decode_to_the_photo_id(photo):
    assert flickr_photo_id(f"https://flic.kr/p/{_base58_encode(photo)}") == str(photo)


@st.composite
def flickr_variants(draw):
    """Two random URL forms of the same random photo (host, farm, server, secret, size, scheme, case)."""
    photo = str(draw(st.integers(min_value=1, max_value=10**11)))

    def one():
        server = draw(st.integers(1, 65535))
        secret = draw(st.text("0123456789abcdef", min_size=4, max_size=10))
        size = draw(st.sampled_from(["", "_m", "_z", "_b", "_o", "_q", "_t"]))
        host = draw(st.sampled_from(["farm{n}.static.flickr.com", "farm{n}.staticflickr.com", "live.staticflickr.com",
                                     "c{n}.staticflickr.com", "static.flickr.com"]))
        farm = draw(st.integers(1, 99))
        prefix = f"{farm}/" if host.startswith("c{") else ""
        scheme = draw(st.sampled_from(["http", "https", "HTTP", "Https"]))
        tail = draw(st.sampled_from(["", "#f", "?s=1"]))
        host = host.format(n=farm)
        if draw(st.booleans()):
            host = host.upper()
        with_secret = draw(st.booleans())
        name = f"{photo}_{secret}{size}" if with_secret else photo
        return f"{scheme}://{host}/{prefix}{server}/{name}.jpg{tail}"

    return photo, one(), one()


@settings(deadline=None)
@given(flickr_variants())
def test_every_flickr_url_form_of_a_photo_gives_its_id(case):
    photo, a, b = case
    assert flickr_photo_id(a) == flickr_photo_id(b) == photo


# --------------------------------------------------------------------------------------------
# canonical_url properties

_SEGMENT = st.text(UNRESERVED + "!$&'()*+,;=:@", min_size=1, max_size=8).filter(lambda s: s not in (".", ".."))
_QUERY_PART = st.text(UNRESERVED + "!$'()*+,;:@/?", min_size=1, max_size=6)


@st.composite
def urls_with_variants(draw):
    """A random URL and a random equivalent spelling of it."""
    scheme = draw(st.sampled_from(["http", "https", "ftp"]))
    labels = draw(st.lists(st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=8),
                           min_size=1, max_size=3))
    host = ".".join(labels) + draw(st.sampled_from([".com", ".org", ".net"]))
    port = draw(st.sampled_from([None, 8080, 21, 9000]))
    segments = draw(st.lists(_SEGMENT, max_size=4))
    params = draw(st.lists(st.tuples(_QUERY_PART, _QUERY_PART), max_size=4))
    trailing = draw(st.booleans())

    def build(variant: bool) -> str:
        rnd = random.Random(draw(st.integers(0, 2**32 - 1))) if variant else None
        s = scheme.upper() if variant and rnd.random() < 0.5 else scheme
        h = "".join(c.upper() if variant and rnd.random() < 0.5 else c for c in host)
        p = f":{port}" if port else ""
        if variant and not port and rnd.random() < 0.5:
            p = {"http": ":80", "https": ":443", "ftp": ":21"}[scheme]
        if variant and port and rnd.random() < 0.3:
            p = f":0{port}"
        segs = []
        for seg in segments:
            if variant and rnd.random() < 0.3:
                segs += [rnd.choice(["x", "y..z", "%2E%2Eq"]), ".."]  # a segment undone by '..'
            if variant and rnd.random() < 0.3:
                segs.append(rnd.choice([".", "%2e"]))
            segs.append(_encode_some(seg, rnd) if variant else seg)
        path = "/" + "/".join(segs) + ("/" if trailing and segs else "")
        qs = [f"{_encode_some(k, rnd) if variant else k}={v}" for k, v in params]
        if variant:
            rnd.shuffle(qs)
            if rnd.random() < 0.3:
                qs.insert(rnd.randrange(len(qs) + 1), "")
        query = ("?" + "&".join(qs)) if qs or (variant and rnd.random() < 0.2) else ""
        frag = "#" + "frag" if variant and rnd.random() < 0.5 else ""
        return f"{s}://{h}{p}{path}{query}{frag}"

    return build(False), build(True)


def _encode_some(text: str, rnd: random.Random) -> str:
    """Percent-encode some unreserved characters, with random hex case (an equivalent spelling)."""
    out = []
    for ch in text:
        if ch in UNRESERVED and rnd.random() < 0.3:
            code = f"{ord(ch):02X}"
            out.append("%" + (code.lower() if rnd.random() < 0.5 else code))
        else:
            out.append(ch)
    return "".join(out)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(urls_with_variants())
def test_equivalent_spellings_have_one_canonical_form(pair):
    base, variant = pair
    assert canonical_url(variant) == canonical_url(base)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=60), urls_with_variants().map(lambda p: p[1]),
                 st.builds(lambda s, t: f"http://{s}/{t}", st.text(max_size=15), st.text(max_size=30))))
def test_canonical_url_is_idempotent(url):
    once = canonical_url(url)
    assert canonical_url(once) == once


@settings(deadline=None)
@given(urls_with_variants())
def test_canonical_url_keeps_distinct_paths_distinct(pair):
    base, _ = pair
    other = re.sub(r"^([^:]+://[^/]+/)", r"\1zq/", base)  # one more path segment
    assert canonical_url(other) != canonical_url(base)
    assert canonical_url(base.replace("://", "://www2.", 1)) != canonical_url(base)  # another host


# --------------------------------------------------------------------------------------------
# the vectorized twin

# strings near the edge of the vectorized fast path: dots, escapes, ports, odd hosts, whitespace
_EDGY_URLS = st.builds(
    lambda scheme, host, parts: f"{scheme}://{host}{''.join(parts)}",
    st.sampled_from(["http", "HTTP", "https", "ftp", "h", "1x", "git+ssh"]),
    st.sampled_from(["a.b", "A.B", "a.b.", ".a", "a-b.c", "a.b:80", "a.b:", "u@a.b", "[::1]", "", "a b"]),
    st.lists(st.sampled_from(["/", "a", "A", ".", "..", "%41", "%2f", "%", "?", "&", "=", "#", ":", "@", " ",
                              "\u00e9", "~", "+", "\t", "flickr"]), max_size=8),
)

_MIXED_URLS = st.lists(
    st.one_of(
        _EDGY_URLS,
        urls_with_variants().map(lambda p: p[0]),
        urls_with_variants().map(lambda p: p[1]),
        flickr_variants().map(lambda c: c[1]),
        st.builds(lambda c: f"https://flic.kr/p/{_base58_encode(c)}", st.integers(1, 10**9)),
        st.text(max_size=30),
        st.none(),
    ),
    max_size=25,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_MIXED_URLS)
def test_vectorized_keys_equal_the_scalar_functions(urls):
    canon, flickr = url_keys(urls)
    assert canon.to_pylist() == [None if u is None else canonical_url(u) for u in urls]
    assert flickr.to_pylist() == [None if u is None else flickr_photo_id_from_url(u) for u in urls]


def test_vectorized_fast_path_handles_the_common_shapes():
    urls = ["HTTP://Example.COM/a/b.jpg", "http://x.com", "http://x.com/./a", None, " http://x.com/a",
            "https://FARM4.staticflickr.com/1/2_3_b.jpg", "http://x.com/a?b=1&a=2", "12345.jpg"]
    canon = canonical_urls(urls)
    assert canon.to_pylist() == ["http://example.com/a/b.jpg", "http://x.com/", "http://x.com/a", None,
                                 "http://x.com/a", "https://farm4.staticflickr.com/1/2_3_b.jpg",
                                 "http://x.com/a?a=2&b=1", "12345.jpg"]
    # a URL column never yields ids from bare file names: only flickr_photo_id() reads those
    assert flickr_photo_ids_from_canonical(canon).to_pylist() == [None, None, None, None, None, "2", None, None]


# The spellings under which CC and SBU rows pointed at RefCOCO+ / VQA-test images in real files
# (the decontamination gap these keys close): each group must give one canonical URL or one photo id,
# scalar and vectorized alike, and a neighbouring id must not.
COCO_SPELLINGS = [
    "http://images.cocodataset.org/train2014/COCO_train2014_000000012345.jpg",
    "http://Images.CocoDataset.ORG/train2014/COCO_train2014_000000012345.jpg",
    "HTTP://IMAGES.COCODATASET.ORG/train2014/COCO_train2014_000000012345.jpg",
    "http://images.cocodataset.org:80/train2014/COCO_train2014_000000012345.jpg",
    "http://images.cocodataset.org/./train2014/COCO_train2014_000000012345.jpg",
    "http://images.cocodataset.org/train2014/./COCO_train2014_000000012345.jpg",
    "http://images.cocodataset.org/tmp/../train2014/COCO_train2014_000000012345.jpg",
    "http://images.cocodataset.org/train2014/COCO_train2014_000000012345.jpg#fragment",
    "http://Images.CocoDataset.ORG:80/./train2014/COCO_train2014_000000012345.jpg#f",
]
FLICKR_SPELLINGS = [
    "http://farm4.staticflickr.com/1004/5432109876_abcdef1234_z.jpg",
    "https://live.staticflickr.com/65535/5432109876_0f1e2d3c4b_o.jpg",
    "https://live.staticflickr.com/65535/5432109876_0f1e2d3c4b_o.JPG",
    "https://LIVE.staticflickr.com:443/65535/5432109876_0f1e2d3c4b_b.jpg#x",
    "http://farm4.static.flickr.com/1004/05432109876_abcdef1234.jpg",
]


def test_coco_url_spellings_share_one_canonical_url_and_flickr_urls_one_photo_id():
    canon, photo = url_keys(COCO_SPELLINGS + FLICKR_SPELLINGS)
    assert set(canon.to_pylist()[: len(COCO_SPELLINGS)]) == {COCO_SPELLINGS[0]}
    assert {canonical_url(u) for u in COCO_SPELLINGS} == {COCO_SPELLINGS[0]}
    assert photo.to_pylist()[: len(COCO_SPELLINGS)] == [None] * len(COCO_SPELLINGS)
    assert set(photo.to_pylist()[len(COCO_SPELLINGS):]) == {"5432109876"}
    assert {flickr_photo_id(u) for u in FLICKR_SPELLINGS} == {"5432109876"}
    neighbours = ["http://images.cocodataset.org/train2014/COCO_train2014_000000012346.jpg",
                  "https://live.staticflickr.com/65535/5432109877_0f1e2d3c4b_o.jpg"]
    canon, photo = url_keys(neighbours)
    assert canon.to_pylist()[0] != COCO_SPELLINGS[0] and photo.to_pylist()[1] != "5432109876"
