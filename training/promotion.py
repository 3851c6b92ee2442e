"""When a newly trained model replaces the promoted one, and which training labels are fit to train on.

The promoted model of a dataset is `<GNNFLOW_HOME>/<dataset>/promoted`, a symlink to one
folder of `<dataset>/model_versions/` (the same files as a `trained_model/` folder). Every
setting here is one field of `PromotionConfig`, the ``promotion`` block of a dataset's
gnnflow.yaml (``ops.promotion.config``); trained_model reads the same block for the label
checks, so one place holds every rule that guards the promoted model.

Before training (`training_label_problem`, blocking): the labelled training nodes must hold
two classes or more, the largest class at most ``max_class_share`` of them, and their class
distribution must lie within a total-variation distance of ``max_label_shift`` of the promoted
model's training labels (`LABELS_FILE` in its version folder), unless ``accept_label_change``.

At promotion (`decide_promotion`), a candidate is promoted when all of these hold:

1. its test accuracy is above always predicting the most frequent training class;
2. the promoted version is not pinned (`gnnflow models pin`);
3. the labels did not change: no labelled test node the promoted model was evaluated on has
   another label now, and the class values are the same (``accept_label_change: true``
   lifts this, and the two models are then compared on the current labels);
4. its headline metric on the labelled test nodes both models were evaluated on with the same
   label is not lower than the promoted model's by more than ``margin`` (`decide`; absolute, on
   the 0..1 scale: 0.01 = one percentage point). A promoted version without an evaluation record
   is compared on the current labels.

Otherwise the promoted model stays, so consumers of `promoted/` keep the good one.

Files (in the folders `assets.common.GnnflowStorage` names):

    model_versions/<version>/training_labels.json   {"classes": [class value, ...],
        "counts": [int, ...]}: the labelled training nodes per class value (the user's label
        value when canonical_graph has a label mapping, else the class index) at training
    model_evaluations/<version>/test_labels.parquet  original_id (the user's id), label int32
        (class index): the labelled test nodes the version was evaluated on; the class values
        are `classes` of the folder's metrics.json (null: integer classes)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.label_classes import read_label_classes
from graphs.infra.config_checks import bounded_repr, check_fields
from graphs.infra.storage import verified

STAGE = "promotion"  # the asset (stage) that applies these rules; its settings block in gnnflow.yaml
HEADLINE_METRICS = ("accuracy", "macro_f1")
LABELS_FILE = "training_labels.json"
TEST_LABELS_FILE = "test_labels.parquet"
MAX_KEPT_VERSIONS = 100_000
_EXAMPLES = 3  # changed nodes or moved classes named in a message
_GYAML = f"ops.{STAGE}.config"


@dataclass(frozen=True, kw_only=True)
class PromotionConfig:
    """When the newest model replaces the promoted one, and which training labels are refused."""

    metric: str = field(
        default="accuracy", metadata={"help": f"headline test metric compared, one of {HEADLINE_METRICS}"}
    )
    margin: float = field(
        default=0.01,
        metadata={"help": "largest drop of the headline metric (0..1 scale; 0.01 = 1 point) that still promotes"},
    )
    max_class_share: float = field(
        default=0.99,
        metadata={
            "help": "training is refused when the largest class holds more than this share of the labelled "
            "training nodes (accuracy would mostly measure that share)"
        },
    )
    max_label_shift: float = field(
        default=0.3,
        metadata={
            "help": "training is refused when the training labels' class distribution lies farther than this "
            "total-variation distance (0..1) from the promoted model's training labels"
        },
    )
    accept_label_change: bool = field(
        default=False,
        metadata={
            "help": "true: the labels were changed on purpose; train despite max_label_shift and promote when "
            "test nodes changed labels or class values changed (both models then compared on the current labels)"
        },
    )
    keep_versions: int = field(
        default=10,
        metadata={
            "help": "model versions kept in model_versions/: the newest this many, plus the promoted and the "
            "pinned ones (older ones are deleted after each recording or promotion)",
            "max": MAX_KEPT_VERSIONS,
        },
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.metric not in HEADLINE_METRICS:
            raise ValueError(f"metric={bounded_repr(self.metric)} must be one of {HEADLINE_METRICS}")
        for name in ("margin", "max_label_shift"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name}={getattr(self, name)} must lie in [0, 1]")
        if not 0 < self.max_class_share <= 1:
            raise ValueError(f"max_class_share={self.max_class_share} must lie in (0, 1]")
        if self.keep_versions < 1:
            raise ValueError(f"keep_versions={self.keep_versions} must be at least 1")


# ---------------------------------------------------------------- labels before training

ClassCounts = dict  # class value (int index or the user's label value) -> labelled training nodes


def class_values(classes: list | None, size: int) -> list:
    """The value of each class index 0..size-1: the label mapping's values, else the indices."""
    if classes is None:
        return list(range(size))
    return list(classes) + list(range(len(classes), size))


def training_label_counts(labels: np.ndarray, split: np.ndarray, classes: list | None) -> ClassCounts:
    """Labelled training nodes per class value (`labels` int class indices, -1 unknown)."""
    train = labels[(split == "train") & (labels >= 0)]
    index, counts = np.unique(train, return_counts=True)
    values = class_values(classes, int(index.max()) + 1 if index.size else 0)
    return {values[int(i)]: int(c) for i, c in zip(index, counts)}


def read_canonical_labels(canonical: Path, columns: tuple[str, ...] = ("label", "split")) -> pa.Table:
    """`columns` of canonical_graph's nodes.parquet, checked against its published hashes."""
    graph = CanonicalGraph.open(canonical)
    return pq.read_table(verified(canonical, graph.NODES, stage=graph.STAGE), columns=list(columns))


def read_training_label_counts(canonical: Path) -> ClassCounts:
    """canonical_graph's labelled training nodes per class value."""
    nodes = read_canonical_labels(canonical)
    labels = np.asarray(nodes.column("label").fill_null(-1).to_numpy(), dtype=np.int64)
    split = np.asarray(nodes.column("split").to_numpy(zero_copy_only=False))
    return training_label_counts(labels, split, read_label_classes(canonical))


def write_label_counts(path: Path, counts: ClassCounts) -> None:
    path.write_text(json.dumps({"classes": list(counts), "counts": list(counts.values())}))


def read_label_counts(path: Path) -> ClassCounts | None:
    """`LABELS_FILE`'s counts; None when the file is absent. ValueError naming it when unreadable."""
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        return {v: int(c) for v, c in zip(doc["classes"], doc["counts"], strict=True)}
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: unreadable training-label record ({str(exc)[:120]})") from None


def total_variation(a: ClassCounts, b: ClassCounts) -> float:
    """Half the L1 distance between the two class distributions (0 = same shares, 1 = disjoint)."""
    keys = list(dict.fromkeys([*a, *b]))
    p = np.array([a.get(k, 0) for k in keys], dtype=np.float64)
    q = np.array([b.get(k, 0) for k in keys], dtype=np.float64)
    if p.sum() == 0 or q.sum() == 0:
        return 0.0
    return float(np.abs(p / p.sum() - q / q.sum()).sum() / 2)


def _largest_moves(now: ClassCounts, before: ClassCounts) -> str:
    keys = list(dict.fromkeys([*before, *now]))
    n_now, n_before = sum(now.values()), sum(before.values())
    moves = sorted(keys, key=lambda k: -abs(now.get(k, 0) / n_now - before.get(k, 0) / n_before))
    return ", ".join(
        f"class {bounded_repr(k)} {before.get(k, 0) / n_before:.1%} -> {now.get(k, 0) / n_now:.1%}"
        for k in moves[:_EXAMPLES]
    )


def training_label_problem(
    counts: ClassCounts, promoted: ClassCounts | None, promoted_version: str | None, cfg: PromotionConfig
) -> str | None:
    """Why training on these labelled training nodes is refused (None: fit to train on), naming the
    figures and the setting to change. `promoted`: the promoted model's training-label counts."""
    total = sum(counts.values())
    if len(counts) < 2:
        (value, n), *_ = list(counts.items()) or [("none", 0)]
        return (
            f"the labelled training nodes hold one class only (class {bounded_repr(value)}: {n} nodes): a model "
            "trained on it predicts that class everywhere; check the label column of the landing folder's "
            "node file"
        )
    value, largest = max(counts.items(), key=lambda kv: kv[1])
    if largest / total > cfg.max_class_share:
        return (
            f"class {bounded_repr(value)} holds {largest} of the {total} labelled training nodes "
            f"({largest / total:.2%}), above {_GYAML}.max_class_share={cfg.max_class_share}: accuracy would mostly "
            f"measure that share; check the label column, or raise max_class_share in gnnflow.yaml"
        )
    if promoted is None or cfg.accept_label_change:
        return None
    tv = total_variation(counts, promoted)
    if tv > cfg.max_label_shift:
        return (
            f"the training labels' class distribution moved from the promoted model {promoted_version}'s by a "
            f"total-variation distance of {tv:.3f}, above {_GYAML}.max_label_shift={cfg.max_label_shift} (largest "
            f"moves: {_largest_moves(counts, promoted)}); check the label column, or set accept_label_change: true "
            "(or a larger max_label_shift) in gnnflow.yaml when the change is intended"
        )
    return None


# ---------------------------------------------------------------- the evidence for promotion


@dataclass(frozen=True)
class LabelRecord:
    """Labelled test nodes a model was evaluated on: the user's ids, class indices, class values."""

    ids: pa.Array
    labels: np.ndarray
    classes: list | None

    def values(self) -> list:
        return class_values(self.classes, int(self.labels.max()) + 1 if self.labels.size else 0)


def positions(ids: pa.Array, among: pa.Array) -> np.ndarray:
    """int64 [len(ids)]: the row of each id in `among` (-1 when absent); ints or strings alike."""
    if len(ids) == 0:
        return np.zeros(0, dtype=np.int64)
    if not ids.type.equals(among.type):
        try:
            among = among.cast(ids.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return np.full(len(ids), -1, dtype=np.int64)
    return np.asarray(pc.index_in(ids, value_set=among).fill_null(-1).to_numpy(), dtype=np.int64)


def remap_classes(index: np.ndarray, from_values: list, to_values: list) -> np.ndarray:
    """Class indices over `from_values` as indices over `to_values` (-1: a class the target lacks;
    negative inputs stay -1)."""
    target = {v: i for i, v in enumerate(to_values)}
    table = np.array([target.get(v, -1) for v in from_values] + [-1], dtype=np.int64)
    index = np.asarray(index, dtype=np.int64)
    return table[np.where((index >= 0) & (index < len(from_values)), index, len(from_values))]


def label_change(before: LabelRecord, now: LabelRecord) -> dict:
    """How the labels of the nodes in both records differ: compared/changed node counts, a few
    changed nodes (id, label then, label now) and the class values added or removed (label
    mappings only: integer classes have no fixed set of values)."""
    then_values, now_values = before.values(), now.values()
    row = positions(now.ids, before.ids)
    both = row >= 0
    old = remap_classes(before.labels[row[both]], then_values, now_values)
    changed = np.flatnonzero(old != now.labels[both])
    where = np.flatnonzero(both)[changed[:_EXAMPLES]]
    then_of = np.asarray(before.labels[row[where]])
    examples = [
        [now.ids[int(i)].as_py(), then_values[int(t)], now_values[int(now.labels[i])]] for i, t in zip(where, then_of)
    ]
    mapped = before.classes is not None and now.classes is not None
    then_set, now_set = set(then_values), set(now_values)
    return {
        "compared_nodes": int(both.sum()),
        "changed_nodes": int(changed.size),
        "examples": examples,
        "classes_added": [v for v in now_values if v not in then_set] if mapped else [],
        "classes_removed": [v for v in then_values if v not in now_set] if mapped else [],
    }


def same_label_mask(before: LabelRecord, now: LabelRecord) -> np.ndarray:
    """bool [len(now.ids)]: nodes of `now` that `before` holds with the same class value."""
    row = positions(now.ids, before.ids)
    old = np.full(len(row), -1, dtype=np.int64)
    old[row >= 0] = remap_classes(before.labels[row[row >= 0]], before.values(), now.values())
    return (row >= 0) & (old == now.labels)


def describe_change(change: dict | None) -> str | None:
    """A sentence naming how the labels changed; None when they did not (or nothing to compare)."""
    if not change or not (change["changed_nodes"] or change["classes_added"] or change["classes_removed"]):
        return None
    parts = []
    if change["changed_nodes"]:
        ex = "; ".join(
            f"node {bounded_repr(i)}: {bounded_repr(a)} -> {bounded_repr(b)}" for i, a, b in change["examples"]
        )
        parts.append(
            f"{change['changed_nodes']} of the {change['compared_nodes']} labelled test nodes the promoted model was "
            f"evaluated on have another label now (e.g. {ex})"
        )
    for key, word in (("classes_added", "new class values"), ("classes_removed", "class values gone")):
        if change[key]:
            parts.append(f"{word}: {bounded_repr(change[key])}")
    return "; ".join(parts)


def majority_baseline(train_labels: np.ndarray, test_labels: np.ndarray) -> tuple[int, float]:
    """(most frequent training class, accuracy of predicting it for every test label)."""
    train = train_labels[train_labels >= 0]
    if train.size == 0 or test_labels.size == 0:
        return -1, 0.0
    majority = int(np.bincount(train).argmax())
    return majority, float((test_labels == majority).mean())


@dataclass(frozen=True)
class Decision:
    """A task's promotion decision: promote?, why, and the metric it compared (`metric`: the
    candidate's `candidate` value, the promoted model's `previous`, None without one)."""

    ok: bool
    why: str
    metric: str
    candidate: float
    previous: float | None = None


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What `evaluation` measured, for `decide_promotion`."""

    candidate_accuracy: float
    majority_accuracy: float
    majority_class: object = None
    promoted_version: str | None = None
    pinned: bool = False
    label_change: str | None = None
    # headline metrics on the labelled test nodes both models were evaluated on with the same
    # label ("same_labels") and on the current labels ("current_labels"): {"nodes", "candidate", "promoted"}
    same_labels: dict | None = None
    current_labels: dict | None = None


def decide(candidate: float, promoted: float | None, cfg: PromotionConfig) -> tuple[bool, str]:
    """(promote?, why) for a candidate headline value against the promoted model's (None: none)."""
    if math.isnan(candidate):
        return False, f"the new model's test {cfg.metric} is undefined (no labelled test nodes)"
    if promoted is None or math.isnan(promoted):
        return True, "no promoted model yet"
    drop = promoted - candidate
    if drop > cfg.margin:
        return False, (
            f"test {cfg.metric} {candidate:.4f} is {drop * 100:.2f} points below the promoted model's "
            f"{promoted:.4f} (margin {cfg.margin * 100:.2f})"
        )
    return True, f"test {cfg.metric} {candidate:.4f} vs promoted {promoted:.4f} (margin {cfg.margin * 100:.2f} points)"


def decide_promotion(ev: Evidence, cfg: PromotionConfig) -> tuple[bool, str]:
    """(promote?, why) by the rules of the module docstring, in that order."""
    if math.isnan(ev.candidate_accuracy):
        return False, "the new model's test accuracy is undefined (no labelled test nodes)"
    if not ev.candidate_accuracy > ev.majority_accuracy:
        return False, (
            f"test accuracy {ev.candidate_accuracy:.4f} does not beat always predicting the most frequent training "
            f"class {bounded_repr(ev.majority_class)} ({ev.majority_accuracy:.4f})"
        )
    if ev.promoted_version is None:
        return True, "no promoted model yet"
    if ev.pinned:
        return False, (
            f"the promoted version {ev.promoted_version} is pinned; run `gnnflow models unpin {ev.promoted_version} "
            "--dataset NAME` to let promotion replace it"
        )
    if ev.label_change is not None and not cfg.accept_label_change:
        return False, (
            f"the labels changed since the promoted version {ev.promoted_version} was evaluated: {ev.label_change}; "
            f"check the label column, or set {_GYAML}.accept_label_change: true when the change is intended"
        )
    basis, pair = _comparison(ev, cfg)
    if pair is None or pair["nodes"] == 0:
        return False, (
            f"no labelled test node that both the new model and the promoted version {ev.promoted_version} were "
            f"evaluated on ({basis}); set {_GYAML}.accept_label_change: true to compare them on the current labels"
        )
    ok, why = decide(pair["candidate"][cfg.metric], pair["promoted"][cfg.metric], cfg)
    return ok, f"{why}, on {pair['nodes']} labelled test nodes ({basis})"


def _comparison(ev: Evidence, cfg: PromotionConfig) -> tuple[str, dict | None]:
    if ev.same_labels is not None and not (cfg.accept_label_change and ev.label_change is not None):
        return "both evaluated on, same labels", ev.same_labels
    return "current labels", ev.current_labels
