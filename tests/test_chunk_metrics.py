import pytest

from sparseattn.chunk_metrics import chunk_f1, chunk_scores, format_scores

GOLD = [["B-NP", "I-NP", "O", "B-VP", "I-VP", "B-NP"], ["B-PP", "B-NP", "I-NP"]]


def test_perfect_prediction_scores_one():
    assert chunk_f1(GOLD, GOLD) == 1.0
    scores = chunk_scores(GOLD, GOLD)
    assert scores["overall"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 5}
    assert scores["NP"]["support"] == 3


def test_known_wrong_prediction_matches_hand_computed_scores():
    # gold chunks: NP[0:2] VP[3:5] NP[5] | PP[0] NP[1:3]                         -> 5
    pred = [["B-NP", "B-NP", "O", "B-VP", "I-VP", "O"], ["B-PP", "I-VP", "I-NP"]]
    # pred chunks (conlleval: an I-X that does not continue an X chunk starts one):
    #   NP[0] NP[1] VP[3:5] | PP[0] VP[1] NP[2]                                 -> 6
    # correct: VP[3:5], PP[0]                                                    -> 2
    p, r = 2 / 6, 2 / 5
    assert chunk_f1(GOLD, pred) == pytest.approx(2 * p * r / (p + r))  # 4/11
    scores = chunk_scores(GOLD, pred)
    assert scores["overall"]["precision"] == pytest.approx(p)
    assert scores["overall"]["recall"] == pytest.approx(r)
    assert scores["NP"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 3}
    assert scores["VP"]["precision"] == pytest.approx(0.5) and scores["VP"]["recall"] == 1.0
    assert "overall" in format_scores(scores).splitlines()[1]


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="sentence 1"):
        chunk_f1(GOLD, [GOLD[0], GOLD[1][:2]])
