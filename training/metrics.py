"""Classification metrics, NumPy only (no DGL, no torch, no sklearn): the one metrics module.

Training (`training.evaluate.accuracies`) and the `evaluation` asset both compute through
these functions; later tasks (link prediction, imbalanced classes) add theirs here.

    y_true   int array (n,), class ids 0..C-1 (rows with a negative label are the caller's to drop)
    y_pred   int array (n,), predicted class ids
    scores   float array (n,) for binary problems: the score of the positive class (1)

Conventions: a metric of an empty input is NaN; a class's precision (recall) with no
predicted (true) members is 0, and macro averages run over the classes present in `y_true`
or `y_pred` (so an absent class neither helps nor hurts). ROC-AUC is the probability that a
random positive outscores a random negative (ties count one half), computed from average
ranks in O(n log n); PR-AUC is average precision (the step-wise area under the
precision-recall curve, sklearn's definition), NaN when one class is absent.

Link prediction (`link_prediction_report`): the scores of held-out positive pairs against
the scores of one fixed set of evaluation negatives shared by every positive. ROC-AUC over
both; each positive's rank among the negatives is OGB's ``1 + (optimistic + pessimistic) / 2``
(``#neg > pos`` and ``#neg >= pos``: a tie counts half); MRR is the mean of 1 / rank and
Hits@K the share of positives with rank <= K, i.e. scored above the K-th best negative
(ogbl-collab's Hits@K when no negative ties).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "accuracy",
    "average_precision",
    "classification_report",
    "confusion_matrix",
    "one_vs_rest_auc",
    "per_class",
    "roc_auc",
    "link_prediction_report",
    "positive_ranks",
    "LINK_HITS_AT",
]

LINK_HITS_AT = (10, 50, 100)
"""The K of the Hits@K that link prediction reports."""


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Share of rows where the prediction equals the label (NaN for no rows)."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    return float((y_true == y_pred).mean()) if y_true.size else float("nan")


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> np.ndarray:
    """(C, C) int64 counts, rows = true class, columns = predicted class."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    if y_true.size and (min(y_true.min(), y_pred.min()) < 0 or max(y_true.max(), y_pred.max()) >= num_classes):
        raise ValueError(f"class ids must lie in 0..{num_classes - 1}")
    flat = np.bincount(y_true * num_classes + y_pred, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes)


def per_class(cm: np.ndarray) -> dict[str, np.ndarray]:
    """Per-class precision, recall, F1 and support (true count) from a confusion matrix."""
    tp = np.diag(cm).astype(np.float64)
    predicted = cm.sum(0).astype(np.float64)
    support = cm.sum(1)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=support > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros_like(tp), where=denom > 0)
    return {"precision": precision, "recall": recall, "f1": f1, "support": support}


def _roc_and_average_precision(y_true: np.ndarray, scores: np.ndarray) -> tuple[float, float]:
    """(ROC-AUC, average precision) of binary labels from one sort of the scores; both NaN when
    either class is absent. Both depend only on the groups of tied scores (their sizes and
    positives), not on the order within a tie, so the sort need not be stable."""
    pos = int(y_true.sum())
    neg = y_true.size - pos
    if pos == 0 or neg == 0:
        return float("nan"), float("nan")
    order = np.argsort(scores)
    ordered = scores[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    sizes = np.diff(np.r_[starts, ordered.size])
    positives = np.add.reduceat(y_true[order].astype(np.int64), starts)
    # rank sum: every row of a tie group gets the group's mean 1-based rank
    mean_rank = starts + (sizes + 1) / 2.0
    roc = float(((positives * mean_rank).sum() - pos * (pos + 1) / 2.0) / (pos * neg))
    # over score thresholds, highest first: (recall step) x precision at that threshold
    tp, seen = np.cumsum(positives[::-1]), np.cumsum(sizes[::-1])
    ap = float((positives[::-1] / pos * (tp / seen)).sum())
    return roc, ap


def roc_auc(y_true: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of binary labels (1 = positive) by the rank-sum statistic."""
    return _roc_and_average_precision(np.asarray(y_true).astype(bool), np.asarray(scores, dtype=np.float64))[0]


def average_precision(y_true: np.ndarray, scores: np.ndarray) -> float:
    """PR-AUC as average precision: sum over score thresholds of (recall step) x precision."""
    return _roc_and_average_precision(np.asarray(y_true).astype(bool), np.asarray(scores, dtype=np.float64))[1]


def one_vs_rest_auc(y_true: np.ndarray, probs: np.ndarray) -> dict[str, np.ndarray]:
    """Per-class ROC-AUC and PR-AUC (float64 [C]) of class c against the rest, scored by
    ``probs[:, c]`` (n x C class probabilities); NaN for a class absent from `y_true` (or
    present in every row). A loop over classes, not rows: one sort of each class's scores
    serves both statistics."""
    y_true = np.asarray(y_true, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[0] != y_true.shape[0]:
        raise ValueError(f"probs must be (n, C) with n = {y_true.shape[0]} rows, got {probs.shape}")
    pairs = [_roc_and_average_precision(y_true == k, np.ascontiguousarray(probs[:, k])) for k in range(probs.shape[1])]
    both = np.array(pairs, dtype=np.float64).reshape(-1, 2)
    return {"roc_auc": both[:, 0].copy(), "pr_auc": both[:, 1].copy()}


def classification_report(
    y_true: np.ndarray, y_pred: np.ndarray, num_classes: int, scores: np.ndarray | None = None
) -> dict:
    """accuracy, macro precision/recall/F1, per-class lists, the confusion matrix and, for two
    classes with `scores` (positive-class probability), ROC-AUC and PR-AUC. With `scores` an
    (n, C) probability matrix: per-class one-vs-rest ROC-AUC and PR-AUC (`one_vs_rest_auc`) in
    ``per_class`` and their means over the classes present in `y_true` (``macro_roc_auc``,
    ``macro_pr_auc``); for C = 2 also ``roc_auc`` / ``pr_auc`` of class 1."""
    cm = confusion_matrix(y_true, y_pred, num_classes)
    pc = per_class(cm)
    present = (pc["support"] > 0) | (cm.sum(0) > 0)
    out = {
        "rows": int(cm.sum()),
        "accuracy": accuracy(y_true, y_pred),
        "macro_precision": float(pc["precision"][present].mean()) if present.any() else float("nan"),
        "macro_recall": float(pc["recall"][present].mean()) if present.any() else float("nan"),
        "macro_f1": float(pc["f1"][present].mean()) if present.any() else float("nan"),
        "per_class": {k: v.tolist() for k, v in pc.items()},
        "confusion_matrix": cm.tolist(),
    }
    if scores is not None and np.ndim(scores) == 2:
        auc = one_vs_rest_auc(y_true, scores)
        out["per_class"].update({k: v.tolist() for k, v in auc.items()})
        has = pc["support"][: auc["roc_auc"].size] > 0
        finite = has & np.isfinite(auc["roc_auc"])
        out["macro_roc_auc"] = float(auc["roc_auc"][finite].mean()) if finite.any() else float("nan")
        finite = has & np.isfinite(auc["pr_auc"])
        out["macro_pr_auc"] = float(auc["pr_auc"][finite].mean()) if finite.any() else float("nan")
        if num_classes == 2:
            out["roc_auc"], out["pr_auc"] = float(auc["roc_auc"][1]), float(auc["pr_auc"][1])
    elif num_classes == 2 and scores is not None:
        out["roc_auc"] = roc_auc(y_true, scores)
        out["pr_auc"] = average_precision(y_true, scores)
    return out


def node_classification_report(nodes, predictions, split: str = "test") -> dict:
    """`classification_report` of a predictions table (index, predicted, probabilities) against
    the canonical nodes table (node_id, label, split), over the labelled nodes of `split`.

    Both are pyarrow tables; rows are matched by the internal index (`index` in predictions,
    `node_id` in the canonical nodes), not by position."""
    node_id = np.asarray(nodes.column("node_id").to_numpy(), dtype=np.int64)
    label = np.asarray(nodes.column("label").fill_null(-1).to_numpy(), dtype=np.int64)
    in_split = np.asarray(nodes.column("split").to_numpy(zero_copy_only=False)) == split
    keep = in_split & (label >= 0)
    # the internal index: `index` (node_id is then the user's id), else node_id of older files
    key = "index" if "index" in predictions.column_names else "node_id"
    pred_id = np.asarray(predictions.column(key).to_numpy(), dtype=np.int64)
    order = np.argsort(pred_id, kind="stable")
    pos = np.searchsorted(pred_id[order], node_id[keep])
    pos = np.minimum(pos, max(pred_id.size - 1, 0))
    found = pred_id.size > 0 and (pred_id[order][pos] == node_id[keep]).all()
    if not found:
        raise ValueError(f"predictions lack {int(keep.sum())} '{split}' nodes of the canonical graph")
    rows = order[pos]
    probs = predictions.column("probabilities").combine_chunks()
    width = probs.type.list_size
    matrix = np.asarray(probs.flatten().to_numpy(), dtype=np.float64).reshape(-1, width)[rows]
    y_pred = np.asarray(predictions.column("predicted").to_numpy(), dtype=np.int64)[rows]
    y_true = label[keep]
    num_classes = max(width, int(y_true.max()) + 1 if y_true.size else 0)
    return classification_report(y_true, y_pred, num_classes, matrix)


def positive_ranks(pos_scores: np.ndarray, neg_scores: np.ndarray) -> np.ndarray:
    """float64 [P]: each positive's rank among the negatives, 1 + (#neg > pos + #neg >= pos) / 2."""
    pos = np.asarray(pos_scores, dtype=np.float64)
    neg = np.sort(np.asarray(neg_scores, dtype=np.float64))
    greater = neg.size - np.searchsorted(neg, pos, side="right")
    greater_equal = neg.size - np.searchsorted(neg, pos, side="left")
    return 1.0 + 0.5 * (greater + greater_equal)


def link_prediction_report(pos_scores: np.ndarray, neg_scores: np.ndarray, ks=LINK_HITS_AT) -> dict:
    """ROC-AUC, MRR and Hits@K of positive pair scores against shared negative pair scores
    (module docstring); NaN for every metric when either side is empty."""
    pos = np.asarray(pos_scores, dtype=np.float64).ravel()
    neg = np.asarray(neg_scores, dtype=np.float64).ravel()
    out = {"positives": int(pos.size), "negatives": int(neg.size)}
    if pos.size == 0 or neg.size == 0:
        return {**out, "auc": float("nan"), "mrr": float("nan"), **{f"hits@{k}": float("nan") for k in ks}}
    labels = np.r_[np.ones(pos.size, bool), np.zeros(neg.size, bool)]
    ranks = positive_ranks(pos, neg)
    out["auc"] = roc_auc(labels, np.r_[pos, neg])
    out["mrr"] = float(np.mean(1.0 / ranks))
    for k in ks:
        out[f"hits@{k}"] = float(np.mean(ranks <= k))
    return out
