"""Imbalanced classes in training: the class-weighted loss and model selection by macro-F1.

``training.class_weighted_loss``: the cross-entropy of a training node of class c is weighted
``w_c = T / (C · T_c)`` (T training nodes, T_c of class c, C classes present; sklearn's
"balanced" weights), and the minibatch loss is the weighted mean ``Σ w_y l / Σ w_y`` — every
class weighs the same in the objective whatever its size. (With GraphSAINT's loss weights the
two multiply.) The seed-side counterpart is ``ShardConfig.seed_weighting: class_balanced``
(`graphs.sampling.weighting`).

``training.select_by: val_macro_f1``: the best model (kept, early-stopped on) is the one of
highest macro-F1 on the validation split (`training.metrics`), not accuracy, which a model
predicting only the majority class maximizes on a 99 : 1 task.
"""

from __future__ import annotations

import numpy as np
import torch

from training import metrics

__all__ = ["SELECT_BY", "class_weights", "selection_score"]

SELECT_BY = ("val_acc", "val_macro_f1")


def class_weights(labels: torch.Tensor, train_mask: torch.Tensor, num_classes: int) -> torch.Tensor:
    """float32 [num_classes]: T / (C · T_c) for each class present among the training nodes, 0 for absent ones."""
    y = labels[train_mask].to(torch.int64)
    counts = torch.bincount(y, minlength=num_classes).to(torch.float64)[:num_classes]
    present = int((counts > 0).sum())
    w = torch.zeros(num_classes, dtype=torch.float64)
    w[counts > 0] = y.numel() / (present * counts[counts > 0])
    return w.to(torch.float32)


def selection_score(
    select_by: str, row: dict, logits: torch.Tensor, labels: torch.Tensor, val_mask: torch.Tensor
) -> float:
    """The number the best model maximizes: ``row['val_acc']``, or the validation macro-F1
    (also stored in ``row['val_macro_f1']``)."""
    if select_by == "val_acc":
        return row["val_acc"]
    m = val_mask.cpu()
    y_true = labels.cpu()[m].numpy()
    y_pred = logits.argmax(1).cpu()[m].numpy()
    num_classes = int(logits.shape[1])
    report = metrics.classification_report(y_true, y_pred, num_classes) if y_true.size else {"macro_f1": np.nan}
    row["val_macro_f1"] = float(report["macro_f1"])
    return row["val_macro_f1"]
