"""The official VQA accuracy against hand-computed cases, normalization edge cases and quirks included."""

from __future__ import annotations

import pytest

from pipeline.finetune.tasks.vqa_eval import (CONTRACTIONS, evaluate_predictions, normalize_prediction,
                                              process_punctuation, question_accuracy, submission)
from pipeline.stores.vqa_answers import answer_score


@pytest.mark.parametrize("raw, expected", [
    ("Two", "2"),                      # number words, after lower-casing
    ("none", "0"),
    ("the dog", "dog"),                # articles dropped
    ("A Red  Ball", "red ball"),       # and repeated spaces collapse
    ("dont", "don't"),                 # apostrophe-less contractions restored
    ("hes", "he's"),
    ("Im", "im"),                      # official table key "Im" is capitalized: never matches (lower-cased first)
    ("yes!", "yes"),                   # '!' not touching a space becomes a space, then trimmed
    ("hello , world", "hello world"),  # ',' touching a space is dropped
    ("one-way", "1 way"),              # '-' becomes a space, then the number word maps
    ("(yes)", "yes"),
    ("1.5", "1.5"),                    # a period before a digit stays
    ("5.", "5"),                       # the official period rule is a lookahead: "5." loses its period
    ("a.m.", "am"),
    ("3,000", "3000"),                 # digit,digit: every punctuation mark is dropped, not spaced
    ("x/y, 1,2", "xy 12"),             # ... for the whole answer, once any digit-comma-digit occurs
    ("\tyes\n", "yes"),
])
def test_normalization_edge_cases(raw, expected):
    assert normalize_prediction(raw) == expected


def test_contraction_table_has_the_official_oddities():
    assert len(CONTRACTIONS) == 120
    assert CONTRACTIONS["somebody'd"] == "somebodyd"  # reversed in the official table, kept as is
    assert CONTRACTIONS["ow's'at"] == "'ow's'at"


def test_accuracy_is_the_leave_one_annotator_out_mean():
    # 3 of 10 say "yes": leaving out one of them leaves 2 matches (2/3), leaving out another leaves 3 (1)
    answers = ["yes"] * 3 + ["no"] * 7
    assert question_accuracy("yes", answers) == pytest.approx((3 * 2 / 3 + 7 * 1) / 10)  # 0.9
    assert question_accuracy("no", answers) == pytest.approx(1.0)
    assert question_accuracy("maybe", answers) == 0.0
    one = ["red"] + ["blue"] * 9
    assert question_accuracy("red", one) == pytest.approx(9 * (1 / 3) / 10)  # 0.3


@pytest.mark.parametrize("count", range(11))
def test_accuracy_matches_the_closed_form_soft_score(count):
    answers = ["cat"] * count + [f"other{i}" for i in range(10 - count)]
    assert question_accuracy("the cat", answers) == pytest.approx(answer_score(count), abs=1e-6)


def test_human_answers_get_punctuation_only_and_only_when_they_differ():
    assert question_accuracy("yes", ["yes."] * 5 + ["yes"] * 5) == 1.0  # "yes." -> "yes" (answers differ)
    assert question_accuracy("yes", ["yes."] * 10) == 0.0  # identical answers are compared raw
    assert question_accuracy("two", ["two"] * 10) == 0.0  # the prediction becomes "2", the humans' stay "two"
    assert question_accuracy("2", ["2"] * 10) == 1.0


def test_overall_and_per_answer_type_in_percent():
    annotations = [
        {"question_id": 1, "answers": ["yes"] * 10, "answer_type": "yes/no"},
        {"question_id": 2, "answers": ["2"] * 3 + ["3"] * 7, "answer_type": "number"},
        {"question_id": 3, "answers": ["red"] * 10, "answer_type": "other"},
    ]
    acc = evaluate_predictions({"1": "yes", "2": "2", "3": "blue"}, annotations)
    assert acc.overall == round(100 * (1.0 + 0.9 + 0.0) / 3, 2) == 63.33
    assert acc.per_answer_type == {"number": 90.0, "other": 0.0, "yes/no": 100.0}
    assert acc.per_question == {"1": 1.0, "2": pytest.approx(0.9), "3": 0.0}
    with pytest.raises(KeyError, match="no prediction for annotated question 3"):
        evaluate_predictions({"1": "yes", "2": "2"}, annotations)


def test_process_punctuation_looks_at_the_original_text():
    # ';' touches a space in the original, so it is dropped everywhere, even where it does not
    assert process_punctuation("a; b;c") == "a bc"


def test_submission_format():
    out = submission({"10": "yes", "9": "2", "x1": "red"})
    assert out == [{"question_id": 9, "answer": "2"}, {"question_id": 10, "answer": "yes"},
                   {"question_id": "x1", "answer": "red"}]
