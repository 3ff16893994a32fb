"""The official VQA v2 accuracy, reimplemented to behave exactly like the evaluation API
(GT-Vision-Lab ``vqaEval.py``), quirks included, so numbers compare with published ones.

Per question: the predicted answer is normalized (newlines/tabs to spaces, strip, punctuation,
then lower case, number words to digits, articles dropped, apostrophe-less contractions
restored). The ten human answers get only the punctuation step, and only when they are not all
identical. The accuracy is the mean over the ten leave-one-annotator-out subsets of
min(1, #matches among the other nine / 3). Overall and per-answer-type accuracies are in percent.

Quirks kept on purpose: the period rule of the official code is a *lookahead* ``(?!<=\\d)`` that
was meant as a lookbehind, so "5." loses its period while "1.5" keeps it; the period substitution
is capped at 32 replacements (``re.UNICODE`` passed as the count); contraction keys written with
capitals ("Im") never match because the text is lower-cased first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

# The official contraction table: written-without-apostrophe (or half-apostrophed) form -> canonical
# form, as "key=value" pairs (including its oddities, e.g. "somebody'd" -> "somebodyd").
_CONTRACTION_PAIRS = """
aint=ain't arent=aren't cant=can't couldve=could've couldnt=couldn't couldn'tve=couldn't've
couldnt've=couldn't've didnt=didn't doesnt=doesn't dont=don't hadnt=hadn't hadnt've=hadn't've
hadn'tve=hadn't've hasnt=hasn't havent=haven't hed=he'd hed've=he'd've he'dve=he'd've hes=he's
howd=how'd howll=how'll hows=how's Id've=I'd've I'dve=I'd've Im=I'm Ive=I've isnt=isn't itd=it'd
itd've=it'd've it'dve=it'd've itll=it'll let's=let's maam=ma'am mightnt=mightn't
mightnt've=mightn't've mightn'tve=mightn't've mightve=might've mustnt=mustn't mustve=must've
neednt=needn't notve=not've oclock=o'clock oughtnt=oughtn't ow's'at='ow's'at 'ows'at='ow's'at
'ow'sat='ow's'at shant=shan't shed've=she'd've she'dve=she'd've she's=she's shouldve=should've
shouldnt=shouldn't shouldnt've=shouldn't've shouldn'tve=shouldn't've somebody'd=somebodyd
somebodyd've=somebody'd've somebody'dve=somebody'd've somebodyll=somebody'll somebodys=somebody's
someoned=someone'd someoned've=someone'd've someone'dve=someone'd've someonell=someone'll
someones=someone's somethingd=something'd somethingd've=something'd've something'dve=something'd've
somethingll=something'll thats=that's thered=there'd thered've=there'd've there'dve=there'd've
therere=there're theres=there's theyd=they'd theyd've=they'd've they'dve=they'd've theyll=they'll
theyre=they're theyve=they've twas='twas wasnt=wasn't wed've=we'd've we'dve=we'd've weve=we've
werent=weren't whatll=what'll whatre=what're whats=what's whatve=what've whens=when's whered=where'd
wheres=where's whereve=where've whod=who'd whod've=who'd've who'dve=who'd've wholl=who'll whos=who's
whove=who've whyll=why'll whyre=why're whys=why's wont=won't wouldve=would've wouldnt=wouldn't
wouldnt've=wouldn't've wouldn'tve=wouldn't've yall=y'all yall'll=y'all'll y'allll=y'all'll
yall'd've=y'all'd've y'alld've=y'all'd've y'all'dve=y'all'd've youd=you'd youd've=you'd've
you'dve=you'd've youll=you'll youre=you're youve=you've
"""
CONTRACTIONS: dict[str, str] = dict(pair.split("=", 1) for pair in _CONTRACTION_PAIRS.split())
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = ("a", "an", "the")
PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",",
               "?", "!")
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")  # sic: see the module docstring
_DIGIT_COMMA_DIGIT = re.compile(r"(\d)(,)(\d)")
_PERIOD_COUNT = int(re.UNICODE)  # the official call passes the flag where sub() takes its count


def process_punctuation(text: str) -> str:
    """Drop a punctuation mark where it touches a space (or anywhere, when the text has a digit-comma-
    digit), else turn it into a space; then drop periods not followed by a digit."""
    out = text
    for p in PUNCTUATION:
        if p + " " in text or " " + p in text or _DIGIT_COMMA_DIGIT.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD.sub("", out, count=_PERIOD_COUNT)


def process_digit_article(text: str) -> str:
    """Lower case, number words -> digits, articles dropped, contractions restored; single spaces."""
    words = [NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    words = [w for w in words if w not in ARTICLES]
    return " ".join(CONTRACTIONS.get(w, w) for w in words)


def normalize_prediction(answer: str) -> str:
    """What the evaluation compares for a predicted answer."""
    text = answer.replace("\n", " ").replace("\t", " ").strip()
    return process_digit_article(process_punctuation(text))


def question_accuracy(prediction: str, human_answers: Sequence[str]) -> float:
    """Official accuracy in [0, 1] of one prediction against the (ten) human answers."""
    if not human_answers:
        raise ValueError("question_accuracy: no human answers")
    res = normalize_prediction(prediction)
    gts = list(human_answers)
    if len(set(gts)) > 1:
        gts = [process_punctuation(a) for a in gts]
    total = 0.0
    for left_out in range(len(gts)):
        matches = sum(1 for j, a in enumerate(gts) if j != left_out and a == res)
        total += min(1.0, matches / 3.0)
    return total / len(gts)


@dataclass(frozen=True)
class VqaAccuracy:
    overall: float  # percent, rounded to 2 decimals as the official tool reports it
    per_answer_type: dict[str, float]
    per_question: dict[str, float]  # question id -> accuracy in [0, 1]
    questions: int


def evaluate_predictions(predictions: Mapping[str, str], annotations: Iterable[Mapping]) -> VqaAccuracy:
    """Score ``predictions`` {question_id: answer} against annotations ``{question_id, answers: [str],
    answer_type}`` (every annotated question must have a prediction, as the official tool demands)."""
    per_question: dict[str, float] = {}
    by_type: dict[str, list[float]] = {}
    for ann in annotations:
        qid = str(ann["question_id"])
        if qid not in predictions:
            raise KeyError(f"no prediction for annotated question {qid}")
        acc = question_accuracy(predictions[qid], [str(a) for a in ann["answers"]])
        per_question[qid] = acc
        by_type.setdefault(str(ann.get("answer_type") or "unknown"), []).append(acc)
    n = len(per_question)
    overall = round(100.0 * sum(per_question.values()) / n, 2) if n else 0.0
    types = {t: round(100.0 * sum(v) / len(v), 2) for t, v in sorted(by_type.items())}
    return VqaAccuracy(overall=overall, per_answer_type=types, per_question=per_question, questions=n)


def submission(predictions: Mapping[str, str]) -> list[dict]:
    """The official results format: ``[{"question_id": int, "answer": str}]`` sorted by question id."""
    def qid(q: str) -> int | str:
        return int(q) if q.lstrip("-").isdigit() else q

    return [{"question_id": qid(q), "answer": a} for q, a in sorted(predictions.items(), key=lambda kv: _key(kv[0]))]


def _key(qid: str) -> tuple[int, int | str]:
    return (0, int(qid)) if qid.lstrip("-").isdigit() else (1, qid)
