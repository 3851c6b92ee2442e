"""`gnnflow score-pairs`: score candidate node pairs with a dataset's link-prediction model.

    gnnflow score-pairs --dataset ego-facebook --pairs candidates.parquet --out scores.parquet

The pairs file has columns ``src`` and ``dst`` in the dataset's own node ids; the output has
them as given plus ``score``, the probability that each pair is an edge, from the dataset's
promoted model, else its trained_model (`training.score_pairs`). GNNFLOW_HOME is read from the
environment (default ./.gnnflow), as the pipeline reads it. Scoring reads the pipeline's files
and never re-materializes any of them.
"""

from __future__ import annotations

import argparse
import os
import sys

from graphs.infra.dataset_names import DatasetNameError

_PROG = "gnnflow score-pairs"


def add_parser(subparsers) -> None:
    """Register `score-pairs` on the `gnnflow` command's subparsers."""
    cmd = subparsers.add_parser(
        "score-pairs", help="score candidate node pairs (Parquet: src, dst) with a link-prediction model"
    )
    cmd.add_argument("--dataset", required=True, help="dataset name (its task is link_prediction)")
    cmd.add_argument("--pairs", required=True, help="Parquet file with columns src, dst (the dataset's node ids)")
    cmd.add_argument("--out", required=True, help="Parquet file to write: src, dst, score (a new path, *.parquet)")
    cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from training.score_pairs import PairsError, score_dataset_pairs  # lazy: torch, +0.9 s on gnnflow
    from training.state_file import StateFileError  # lazy: torch, +0.8 s on gnnflow

    home = os.environ.get("GNNFLOW_HOME", ".gnnflow")
    try:
        done = score_dataset_pairs(home, args.dataset, args.pairs, args.out)
    except (PairsError, DatasetNameError, StateFileError, FileNotFoundError, ValueError) as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 2
    print(f"scored {done['pairs']} pairs with {done['model_dir']} -> {done['out']}")
    return 0
