"""training.metrics against brute-force reference computations written from the definitions."""

import numpy as np
import pytest

from training.metrics import (
    accuracy,
    average_precision,
    classification_report,
    confusion_matrix,
    one_vs_rest_auc,
    per_class,
    roc_auc,
)


def _brute_roc_auc(y, s):
    pos = [a for a, t in zip(s, y) if t == 1]
    neg = [b for b, t in zip(s, y) if t == 0]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def _brute_average_precision(y, s):
    y, s = np.asarray(y), np.asarray(s)
    total, prev_recall = 0.0, 0.0
    for thr in sorted(set(s.tolist()), reverse=True):
        chosen = s >= thr
        tp = int((chosen & (y == 1)).sum())
        precision = tp / int(chosen.sum())
        recall = tp / int((y == 1).sum())
        total += (recall - prev_recall) * precision
        prev_recall = recall
    return total


def test_textbook_binary_values():
    # the example of sklearn's roc_auc_score / average_precision_score documentation
    y, s = [0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]
    assert roc_auc(y, s) == pytest.approx(0.75)
    assert average_precision(y, s) == pytest.approx(0.8333333333)


@pytest.mark.parametrize("seed", range(6))
def test_binary_scores_match_brute_force_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    y = rng.integers(0, 2, n)
    y[0], y[1] = 0, 1
    s = rng.integers(0, 6, n) / 5.0  # few distinct values: many ties
    assert roc_auc(y, s) == pytest.approx(_brute_roc_auc(y, s))
    assert average_precision(y, s) == pytest.approx(_brute_average_precision(y, s))


def test_perfect_and_reversed_scores():
    y = np.array([0, 1, 0, 1, 1])
    s = np.array([0.1, 0.9, 0.2, 0.8, 0.7])
    assert roc_auc(y, s) == 1.0 and average_precision(y, s) == 1.0
    assert roc_auc(y, -s) == 0.0
    assert np.isnan(roc_auc([1, 1], [0.2, 0.3])) and np.isnan(average_precision([0, 0], [0.2, 0.3]))


@pytest.mark.parametrize("seed", range(4))
def test_confusion_and_per_class_match_definitions(seed):
    rng = np.random.default_rng(seed)
    c, n = 4, 80
    y = rng.integers(0, c, n)
    p = np.where(rng.random(n) < 0.6, y, rng.integers(0, c, n))
    cm = confusion_matrix(y, p, c)
    ref = np.zeros((c, c), dtype=np.int64)
    for t, q in zip(y, p):
        ref[t, q] += 1
    assert (cm == ref).all()
    pc = per_class(cm)
    for k in range(c):
        tp = int(((y == k) & (p == k)).sum())
        prec = tp / int((p == k).sum()) if (p == k).any() else 0.0
        rec = tp / int((y == k).sum()) if (y == k).any() else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        assert (pc["precision"][k], pc["recall"][k], pc["f1"][k]) == pytest.approx((prec, rec, f1))
    assert accuracy(y, p) == pytest.approx(sum(int(a == b) for a, b in zip(y, p)) / n)


def test_report_macro_over_present_classes_and_binary_extras():
    y = np.array([0, 0, 1, 1, 1])
    p = np.array([0, 1, 1, 1, 0])
    r = classification_report(y, p, 3)  # class 2 never occurs: left out of the macro average
    # class 0: P=1/2 R=1/2 F1=1/2; class 1: P=2/3 R=2/3 F1=2/3
    assert r["macro_f1"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert r["accuracy"] == pytest.approx(3 / 5)
    assert r["confusion_matrix"] == [[1, 1, 0], [1, 2, 0], [0, 0, 0]]
    assert "roc_auc" not in r
    b = classification_report(y, p, 2, scores=np.array([0.2, 0.6, 0.9, 0.7, 0.4]))
    assert b["roc_auc"] == pytest.approx(_brute_roc_auc(y, [0.2, 0.6, 0.9, 0.7, 0.4]))
    assert b["pr_auc"] == pytest.approx(_brute_average_precision(y, [0.2, 0.6, 0.9, 0.7, 0.4]))
    with pytest.raises(ValueError, match="0..1"):
        confusion_matrix([0, 2], [0, 1], 2)


@pytest.mark.parametrize("seed", [0, 1])
def test_one_vs_rest_auc_and_minority_recall_match_brute_force(seed):
    """An imbalanced 3-class task (class 2 about 3 %): per-class one-vs-rest ROC-AUC and PR-AUC,
    their macro means and the minority recall, each against the definition computed by hand."""
    rng = np.random.default_rng(seed)
    y = rng.choice(3, size=300, p=[0.67, 0.30, 0.03])
    y[:2] = 2  # at least two minority rows
    logits = rng.normal(size=(300, 3)) + 1.5 * np.eye(3)[y]
    probs = np.round(np.exp(logits) / np.exp(logits).sum(1, keepdims=True), 2)  # rounded: ties happen
    pred = probs.argmax(1)
    auc = one_vs_rest_auc(y, probs)
    for c in range(3):
        yc = (y == c).astype(int)
        assert auc["roc_auc"][c] == pytest.approx(_brute_roc_auc(yc, probs[:, c]))
        assert auc["pr_auc"][c] == pytest.approx(_brute_average_precision(yc, probs[:, c]))
    r = classification_report(y, pred, 3, scores=probs)
    assert r["macro_roc_auc"] == pytest.approx(
        np.mean([_brute_roc_auc((y == c).astype(int), probs[:, c]) for c in range(3)])
    )
    assert r["macro_pr_auc"] == pytest.approx(
        np.mean([_brute_average_precision((y == c).astype(int), probs[:, c]) for c in range(3)])
    )
    minority = [i for i in range(300) if y[i] == 2]
    assert r["per_class"]["recall"][2] == pytest.approx(sum(pred[i] == 2 for i in minority) / len(minority))
    assert r["per_class"]["roc_auc"][2] == pytest.approx(auc["roc_auc"][2])
    assert "roc_auc" not in r  # the binary headline only for two classes
    two = classification_report(
        yc := (y == 2).astype(int), (pred == 2).astype(int), 2, scores=np.c_[1 - probs[:, 2], probs[:, 2]]
    )
    assert two["roc_auc"] == pytest.approx(_brute_roc_auc(yc, probs[:, 2]))
    assert two["pr_auc"] == pytest.approx(_brute_average_precision(yc, probs[:, 2]))
