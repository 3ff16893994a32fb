"""VQA v2 answer normalization, soft scores and the answer vocabulary.

Normalization follows the official VQA evaluation: punctuation handling that keeps decimal
points and thousands commas, number words to digits, articles dropped, apostrophe-less
contractions restored ("dont" -> "don't"). A soft score is the official accuracy of an answer
given by ``c`` of the 10 annotators: min(#matches / 3, 1) averaged over the ten 9-annotator
subsets, i.e. 0, 0.3, 0.6, 0.9, 1.0 for c = 0..4+.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

_CONTRACTIONS = (
    "aren't can't couldn't couldn't've didn't doesn't don't hadn't hadn't've hasn't haven't he'd he'd've "
    "he'll he's how'd how'll how's i'd i'd've i'll i'm i've isn't it'd it'd've it'll it's let's ma'am "
    "mightn't mightn't've might've mustn't must've needn't not've o'clock oughtn't shan't she'd she'd've "
    "she'll she's should've shouldn't shouldn't've somebody'd somebody'll somebody's someone'd someone'll "
    "someone's something'd something'll something's that'd that's there'd there're there's they'd "
    "they'd've they'll they're they've wasn't we'd we'd've we'll we're we've weren't what'll what're "
    "what's what've when's where'd where's where've who'd who'd've who'll who're who's who've why'll "
    "why're why's won't would've wouldn't wouldn't've y'all y'all'll y'all'd've you'd you'd've you'll "
    "you're you've"
).split()
# the evaluation maps the form written without apostrophes back to the contraction
CONTRACTION_MAP = {c.replace("'", ""): c for c in _CONTRACTIONS}
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = frozenset({"a", "an", "the"})
PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",",
               "?", "!")
_PERIOD_STRIP = re.compile(r"(?<!\d)\.(?!\d)")
_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")


def _strip_punctuation(text: str) -> str:
    out = text
    for p in PUNCTUATION:
        if (p + " " in text or " " + p in text) or _COMMA_STRIP.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD_STRIP.sub("", out)


def normalize_answer(answer: str) -> str:
    """One answer string -> its official normalized form (lower case, single spaces)."""
    text = answer.replace("\n", " ").replace("\t", " ").strip().lower()
    text = _strip_punctuation(text)
    words = []
    for word in text.split():
        word = NUMBER_WORDS.get(word, word)
        if word in ARTICLES:
            continue
        words.append(CONTRACTION_MAP.get(word, word))
    return " ".join(words)


def answer_score(count: int) -> float:
    """Official VQA accuracy of an answer that ``count`` of the 10 annotators gave."""
    if count <= 0:
        return 0.0
    # dropping one of the 10 annotators: 10-count subsets keep all matches, count subsets lose one
    kept = min(count / 3.0, 1.0)
    lost = min((count - 1) / 3.0, 1.0)
    return round(((10 - count) * kept + count * lost) / 10.0, 6)


def build_answer_vocab(answers: Iterable[str], *, min_count: int) -> dict[str, int]:
    """answer -> label for normalized answers given at least ``min_count`` times.

    Labels are ordered by decreasing count, then alphabetically, so the mapping is deterministic.
    """
    counts = Counter(normalize_answer(a) for a in answers if a)
    kept = sorted((a for a, c in counts.items() if c >= min_count and a), key=lambda a: (-counts[a], a))
    return {a: i for i, a in enumerate(kept)}


def soft_targets(answers: Iterable[str], ans2label: dict[str, int]) -> tuple[list[int], list[float]]:
    """The 10 human answers of one question -> (labels, scores) for answers in the vocabulary."""
    counts = Counter(normalize_answer(a) for a in answers if a)
    pairs = sorted((ans2label[a], answer_score(c)) for a, c in counts.items() if a in ans2label)
    return [p[0] for p in pairs], [p[1] for p in pairs]
