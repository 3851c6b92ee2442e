"""graphs.infra.host_memory: large tensors come from glibc's heap inside the context and are kept when freed;
the memory limit a cgroup sets; and the bytes a process had read from disk (graphs.infra.storage)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

# Run in a fresh interpreter: glibc's malloc settings are process-wide.
PROBE = textwrap.dedent(
    """
    import json
    import torch
    from graphs.infra.host_memory import reuse_freed_memory

    BIG = 64 * 2**20  # above glibc's largest mmap threshold (32 MiB)

    def heap():
        with open("/proc/self/maps") as maps:
            lo, hi = next(line for line in maps if line.rstrip().endswith("[heap]")).split()[0].split("-")
        return int(lo, 16), int(hi, 16)

    def in_heap(t):
        lo, hi = heap()
        return lo <= t.data_ptr() < hi

    def rss():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096

    def big(n=BIG):
        return torch.ones(n, dtype=torch.uint8)  # plain malloc'd CPU memory, touched

    del_ = big()  # the heap exists, and torch's thread pool
    del del_
    out = {}
    t = big()
    out["defaults_in_heap"] = in_heap(t)
    del t
    with reuse_freed_memory() as active:
        out["active"] = active
        t = big()
        out["inside_in_heap"] = in_heap(t)
        held = rss()
        del t
        out["kept_after_free"] = rss() > held - BIG // 2  # the freed pages stay with the process
        with reuse_freed_memory():
            pass
        t = big()
        out["in_heap_after_inner_exit"] = in_heap(t)  # the outer entry still holds
        del t
        kept = rss()
    out["handed_back_after_exit"] = rss() < kept - BIG // 2
    # larger than all the heap's free memory, which glibc would hand out again under any settings
    t = big(4 * BIG)
    out["after_in_heap"] = in_heap(t)
    del t
    with reuse_freed_memory(False) as active:
        out["disabled_active"] = active
        t = big(4 * BIG)
        out["disabled_in_heap"] = in_heap(t)
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_large_tensors_come_from_the_heap_and_stay_there_only_inside():
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    out = json.loads(run.stdout)
    assert out == {
        # glibc's defaults: a 64 MiB tensor is its own mmap, unmapped (and faulted in anew) each time
        "defaults_in_heap": False,
        "active": True,
        # inside: it comes from the heap, and freeing it keeps the pages for the next allocation
        "inside_in_heap": True,
        "kept_after_free": True,
        "in_heap_after_inner_exit": True,
        # the last exit returns the kept pages and restores the defaults
        "handed_back_after_exit": True,
        "after_in_heap": False,
        "disabled_active": False,
        "disabled_in_heap": False,
    }


def test_gc_paused_switches_the_collector_off_inside_and_restores_it_on_exit_and_on_error():
    import gc

    from graphs.infra.host_memory import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the outer entry still holds after the inner exit
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("stage failed")
    assert gc.isenabled()
    gc.disable()  # off before: stays off after
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_ingest_stage_runs_with_the_collector_paused_and_restores_it(tmp_path, monkeypatch):
    import gc

    import pyarrow as pa
    import pyarrow.parquet as pq

    import graphs.stages.canonical as canonical

    landing = tmp_path / "landing"
    (landing / "edges").mkdir(parents=True)
    pq.write_table(pa.table({"src": [0, 1, 2], "dst": [1, 2, 0]}), landing / "edges" / "part-0.parquet")
    seen = []
    real = canonical.write_nodes
    monkeypatch.setattr(canonical, "write_nodes", lambda *a, **k: seen.append(gc.isenabled()) or real(*a, **k))
    summary = canonical.build_canonical_graph(landing, tmp_path / "out")
    assert summary["edges"] == 6 and seen == [False]
    assert gc.isenabled()


def test_the_memory_limit_is_the_lowest_cgroup_limit_above_the_process(tmp_path):
    """v1 limits on the process's memory cgroup and its parents count, v2's "max" does not, and a
    group's path is read relative to the root its hierarchy is mounted from."""
    from graphs.infra.host_memory import _cgroup_limits, memory_limit_bytes

    proc, v1, v2 = tmp_path / "proc", tmp_path / "memory", tmp_path / "unified"
    proc.mkdir()
    (proc / "cgroup").write_text("5:cpu:/other\n4:memory:/jobs/a/b\n0::/x\n")
    (proc / "mountinfo").write_text(
        f"30 25 0:26 /jobs {v1} rw,relatime - cgroup cgroup rw,memory\n"
        f"31 25 0:27 / {v2} rw,relatime - cgroup2 cgroup2 rw\n"
        f"32 25 0:28 / {tmp_path / 'cpu'} rw - cgroup cgroup rw,cpu\n"
    )
    (v1 / "a" / "b").mkdir(parents=True)
    (v1 / "a" / "b" / "memory.limit_in_bytes").write_text("3000\n")
    (v1 / "a" / "memory.limit_in_bytes").write_text("2000\n")
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v2 / "x").mkdir(parents=True)
    (v2 / "x" / "memory.max").write_text("max\n")
    assert sorted(_cgroup_limits(proc)) == [2000, 3000, 9223372036854771712]
    assert _cgroup_limits(tmp_path / "absent") == []
    limit = memory_limit_bytes()
    assert limit is not None and 0 < limit <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_disk_reads_count_what_the_disk_served_not_page_cache_hits(tmp_path):
    from graphs.infra.storage import disk_read_bytes, drop_page_cache

    mounts = [
        line.split(" - ")[0].split()[4:5] + line.split(" - ")[1].split()[:1] for line in open("/proc/self/mountinfo")
    ]
    here = max((m for m in mounts if str(tmp_path).startswith(m[0])), key=lambda m: len(m[0]))
    if here[1] in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is on {here[1]}: its files are memory, never read from a disk")
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(8 << 20))
    drop_page_cache(path)
    before = disk_read_bytes()
    if before is None:
        pytest.skip("this kernel does not report /proc/self/io")
    path.read_bytes()
    cold = disk_read_bytes() - before
    path.read_bytes()  # now from the page cache
    warm = disk_read_bytes() - before - cold
    assert cold >= 8 << 20 and warm < 1 << 20
