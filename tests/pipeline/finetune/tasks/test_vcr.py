"""VCR's three accuracies by hand."""

from __future__ import annotations

from pipeline.finetune.tasks.vcr import vcr_accuracies


def test_q2ar_needs_both_right_on_the_questions_scored_for_both():
    qa_ids, qar_ids = ["a", "b", "c", "d"], ["a", "b", "c"]  # d has no gold answer for QA→R
    out = vcr_accuracies(qa_right={"a", "b", "d"}, qar_right={"a", "c"}, qa_ids=qa_ids, qar_ids=qar_ids)
    assert out == {"q2a": 75.0, "qa2r": round(200 / 3, 4), "q2ar": round(100 / 3, 4), "questions": 3}
    assert vcr_accuracies(set(), set(), [], []) == {"q2a": 0.0, "qa2r": 0.0, "q2ar": 0.0, "questions": 0}


def test_q2ar_item_scores_are_the_headline_s_questions_and_mean():
    """The item scores (the paired interval's input) and the Q→AR headline come from one definition."""
    from pipeline.finetune.tasks.vcr import q2ar_scores

    qa_ids, qar_ids = ["a", "b", "c", "d"], ["a", "b", "c", "e"]
    scores = q2ar_scores({"a", "b", "d"}, {"a", "c", "e"}, qa_ids, qar_ids)
    assert scores == {"a": 1.0, "b": 0.0, "c": 0.0}
    out = vcr_accuracies({"a", "b", "d"}, {"a", "c", "e"}, qa_ids, qar_ids)
    assert out["questions"] == len(scores) and out["q2ar"] == round(100 * sum(scores.values()) / len(scores), 4)
