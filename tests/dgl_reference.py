"""DGL's own writer of the distributed partition format, for our assignment: the reference
that tests/test_distdgl_format.py and benchmarks/partition.py compare
`graphs.formats.distdgl_format.write_distdgl_parts` against.

`write_distdgl` has DGL 2.1's `partition_graph` write the files; it holds several
whole-graph copies. DGL's `partition_graph` accepts no precomputed assignment (with
part_method="metis" it runs METIS again); it looks the function up as the module attribute
`dgl.distributed.partition.metis_partition_assignment` at call time, so `write_distdgl`
substitutes that attribute, for the duration of one call, with a function that returns our
assignment, and checks that it was called (a DGL that no longer makes the call fails
loudly instead of silently re-partitioning).
"""

from __future__ import annotations

import os
from unittest import mock

import dgl
import dgl.distributed.partition as dgl_partition
import numpy as np
import torch

from graphs.kernels.metis import quiet_stdout


def write_distdgl(graph, part: np.ndarray, k: int, out_dir: str | os.PathLike, graph_name: str):
    """DGL's distributed partition format for our assignment (1-hop halos); returns orig_nids
    (a dict of each node type's ids for a heterograph).

    `graph` carries the node data to split (feat, label, masks). See the module docstring
    for how DGL 2.1's `partition_graph` is made to use `part` instead of re-running METIS.
    """
    calls = []

    def precomputed(sim_g, num_parts, **_kwargs):
        if sim_g.num_nodes() != len(part) or num_parts != k:
            raise RuntimeError(
                f"partition_graph asked for {num_parts} parts of {sim_g.num_nodes()} nodes; "
                f"the precomputed assignment has {k} parts of {len(part)} nodes"
            )
        calls.append(num_parts)
        return torch.from_numpy(part.astype(np.int64))

    with quiet_stdout(), mock.patch.object(dgl_partition, "metis_partition_assignment", precomputed):
        orig_nids, _ = dgl.distributed.partition_graph(
            graph, graph_name, k, str(out_dir), num_hops=1, part_method="metis", return_mapping=True
        )
    if k > 1 and len(calls) != 1:
        raise RuntimeError(
            "dgl.distributed.partition_graph did not take the precomputed assignment (DGL version "
            f"{dgl.__version__}; written for 2.1.0): see tests/dgl_reference.py's module docstring"
        )
    if isinstance(orig_nids, dict):  # a heterograph: each type's own ids in new-id order
        return {t: ids.numpy().astype(np.int64) for t, ids in orig_nids.items()}
    return orig_nids.numpy().astype(np.int64)
