"""A stage run for the SIGKILL tests in tests/test_faults.py, as the assets run it (the
dataset's lock, a staging folder published only when complete), in a process of its own:

    python -m tests.kill_worker STAGE HOME LANDING [MARKER]

With MARKER, the run stops after its first output file is created (every writer the stages
use is wrapped), touches MARKER and sleeps until the test kills it: a kill mid-write.
"""

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")

STAGES = ("canonical_graph", "normalized_adjacency", "metis_partitions", "compressed_graph", "minibatch_shards")


def _hang_after_first_write(marker: Path) -> None:
    import numpy as np
    import pyarrow.parquet as pq

    import graphs.sampling.writer as sampling_writer

    def wrap(owner, name):
        real = getattr(owner, name)

        def writer(*args, **kwargs):
            result = real(*args, **kwargs)
            if name == "open_memmap" and not str(kwargs.get("mode", args[1] if len(args) > 1 else "r+")).startswith(
                "w"
            ):
                return result  # np.load(mmap_mode=...) reading an input
            marker.write_text(str(os.getpid()))
            while True:
                time.sleep(1)
            return result

        setattr(owner, name, writer)

    wrap(np, "save")
    wrap(np.lib.format, "open_memmap")
    wrap(pq, "write_table")
    wrap(sampling_writer, "write_npz")


def run_stage(stage: str, home: Path, landing: Path) -> None:
    from graphs.infra.storage import dataset_lock, staged_output

    with dataset_lock(home), staged_output(home / stage) as out:
        if stage == "canonical_graph":
            from graphs.stages.canonical import build_canonical_graph

            build_canonical_graph(landing, out)
        elif stage == "normalized_adjacency":
            from graphs.stages.normalize import build_normalized_adjacency

            build_normalized_adjacency(home / "canonical_graph", out)
        elif stage == "metis_partitions":
            from graphs.stages.partition import PartitionConfig, build_partitions

            build_partitions(home / "canonical_graph", out, PartitionConfig(num_parts=2, write_distdgl=False))
        elif stage == "compressed_graph":
            from graphs.stages.compress import build_compressed_graph

            build_compressed_graph(
                home / "canonical_graph", home / "normalized_adjacency", home / "metis_partitions", out
            )
        else:
            from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards

            inputs = load_shard_inputs(home / "canonical_graph", home / "normalized_adjacency")
            write_minibatch_shards(inputs, out, ShardConfig(fanouts="4,4", batch_size=32, epochs=2, world_size=2))


if __name__ == "__main__":
    stage, home, landing = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if len(sys.argv) > 4:
        _hang_after_first_write(Path(sys.argv[4]))
    run_stage(stage, home, landing)
