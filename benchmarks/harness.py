"""The one owner of benchmark scales and of the result-record schema.

    make bench SCALE=small                      # = .venv/bin/python benchmarks/run.py --scale small
    .venv/bin/python benchmarks/run.py --scale medium --only ingest,adjacency

Scales (`SCALES`): the generated graph of every graph benchmark (nodes, edge rows before
ingest symmetrizes and deduplicates) and the workload of the others (accuracy parts and
seeds, training epochs, aggregation size), per scale. `bench_args(name, scale)` is the
command line each benchmark script runs with; nothing else writes a size.

Records (`Record`): one row of the results table, one comparison of ours against its peer
measured in the same run: the stage, the metric (seconds, seconds per epoch, test accuracy
%, ...), our value, the peer's value and name, ratio = ours / peer, the target bound on
the ratio, both sides' peak RSS (each side in a child that did nothing else first, see
`benchmarks/_child.py`), and the input size. A benchmark script given ``--record FILE``
appends its records there as JSON lines (`emit`); `benchmarks/run.py` collects them and
writes, via `write_results`:

    benchmarks/results/<scale>.json   {"schema_version", "scale", "sizes", "machine", "date",
                                       "benchmarks": {name: {"seconds", "returncode"}},
                                       "records": [Record as dict, ...]}
    benchmarks/results/<scale>.md     the same records as a Markdown table, machine and date on top

BENCHMARKS.md holds generated regions, each between `<!-- generated: SOURCE -->` and
`<!-- end generated -->`: `benchmarks/harness.py <scale>` is `render_markdown(scale)` (every record
of results/<scale>.json with the machine and the date of the run it came from), and
`benchmarks/pipeline_run.py --table [--out FILE]` is that script's table of its records;
`benchmarks/memory_wall.py --table` the memory-wall run's tables.
tests/test_benchmarks_doc.py fails when one differs from what its source renders now; after a
`make bench` (or a pipeline run) rewrite them with

    .venv/bin/python benchmarks/harness.py --update-doc             # BENCHMARKS.md in place
    .venv/bin/python benchmarks/harness.py --markdown medium        # print one scale's region

Per-stage cost growth: `slopes(points)` fits log(seconds) against log(edges) between sizes
(`benchmarks/slopes.py` reads the result files and 13a's `scale_stages.json`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True, kw_only=True)
class Scale:
    """The workload of every benchmark at one scale."""

    nodes: int = field(metadata={"help": "Nodes of the generated graph (graph benchmarks)."})
    edges: int = field(metadata={"help": "Edge rows of the generated graph, before symmetrizing and dedupe."})
    accuracy_parts: str = field(metadata={"help": "benchmarks/accuracy.py --parts at this scale."})
    accuracy_seeds: int = field(metadata={"help": "Training seeds per accuracy figure."})
    train_epochs: int = field(metadata={"help": "Epochs of each side of benchmarks/train_vs_dgl.py."})
    train_repeat: int = field(
        metadata={
            "help": "Alternating DGL / ours runs of benchmarks/train_vs_dgl.py and rounds of benchmarks/sampling.py."
        }
    )
    compression_datasets: str = field(metadata={"help": "benchmarks/compression.py --datasets, comma-separated."})
    placement_graphs: str = field(metadata={"help": "benchmarks/placement.py --graphs."})


SCALES: dict[str, Scale] = {
    # for the harness's own test: seconds, every benchmark's code path
    "tiny": Scale(
        nodes=3_000,
        edges=30_000,
        accuracy_parts="cora",
        accuracy_seeds=1,
        train_epochs=1,
        train_repeat=1,
        compression_datasets="cora",
        placement_graphs="cora",
    ),
    # a few minutes on 2 cores
    "small": Scale(
        nodes=100_000,
        edges=1_000_000,
        accuracy_parts="defaults",
        accuracy_seeds=1,
        train_epochs=2,
        train_repeat=3,
        compression_datasets="cora",
        placement_graphs="cora",
    ),
    # the 1M nodes / 10M edge rows
    "medium": Scale(
        nodes=1_000_000,
        edges=10_000_000,
        accuracy_parts="defaults,recipes,cora,citeseer,int8",
        accuracy_seeds=3,
        train_epochs=1,
        train_repeat=3,
        compression_datasets="cora,citeseer,heavy",
        placement_graphs="cora,generated",
    ),
    # 10M nodes / 100M edge rows: hours, and more memory than some peers fit in
    "large": Scale(
        nodes=10_000_000,
        edges=100_000_000,
        accuracy_parts="defaults,recipes,cora,citeseer,int8,ddp,demo",
        accuracy_seeds=5,
        train_epochs=1,
        train_repeat=1,
        compression_datasets="demo,heavy,cora,citeseer",
        placement_graphs="cora,generated",
    ),
}

# The benchmarks `benchmarks/run.py` runs, in this order (scripts benchmarks/<name>.py).
BENCHMARKS = (
    "ingest",
    "adjacency",
    "partition",
    "sampling",
    "train_vs_dgl",
    "frameworks",
    "aggregate",
    "bloom",
    "accuracy",
    "compression",
    "weighted",
    "placement",
    "feature_cache",
)


# The ratio targets for ingest and adjacency are set at 1M nodes / 10M edge rows; below
# that, fixed costs (imports, kernel loading, the degree plot) dominate a sub-second peer.
TARGET_EDGES = 10_000_000
# The tiered feature store's targets are set on the 10M-node graph: at 1M nodes its 10 % warm tier
# (51 MB of 128-wide float32 rows) is partly held by the 32 MB L3, which the 10M-node one (512 MB) is not.
FEATURE_TARGET_NODES = 10_000_000


def shards_current(out: Path) -> bool:
    """Whether `out` holds minibatch shards in the format this code reads; a benchmark's cached
    shards of an older format are written again instead of failing the run."""
    from graphs.formats.shard_format import SUPPORTED_FORMAT_VERSION

    manifest = Path(out) / "manifest.json"
    return manifest.is_file() and json.loads(manifest.read_text()).get("format_version") == SUPPORTED_FORMAT_VERSION


def adjacency_current(adj: Path) -> bool:
    """Whether `adj` holds a normalized adjacency written by this code: one written before Â's
    scale factors (`graphs.stages.normalize`) is built again, so that the shards made from it get the
    weight encoding a user's would."""
    from graphs.formats.stage_artifact import StageFormatError
    from graphs.stages.normalize import Adjacency

    try:
        return "scale_factors" in Adjacency.open(adj).summary
    except StageFormatError:  # none yet, or of another format version: built again
        return False


def target_at(size: int, bound: float, set_at: int = TARGET_EDGES) -> float | None:
    """`bound` when the input's `size` (edge rows, or what `set_at` counts) is as large as the
    target is set for, else None (no target)."""
    return bound if size >= set_at else None


def scale_of(name: str) -> Scale:
    if name not in SCALES:
        raise ValueError(f"unknown scale {name!r}; one of {sorted(SCALES)}")
    return SCALES[name]


def bench_args(name: str, scale: str) -> list[str]:
    """The command line of benchmarks/<name>.py at `scale` (without --record)."""
    s = scale_of(name=scale)
    size = ["--nodes", str(s.nodes), "--edges", str(s.edges)]
    # ingest and sampling share one generated graph; adjacency, partition and feature_cache another
    shared = {"ingest": "gen", "sampling": "gen", "accuracy": "accuracy"}
    shared |= dict.fromkeys(("adjacency", "partition", "feature_cache"), "graphs")
    work = ["--work", f"bench_out/{scale}/{shared.get(name, name)}"]
    args = {
        # best of 3 rounds where a round takes seconds: one round of a seconds-long stage is noise
        "ingest": size
        + ["--ids", "dense,sparse,string"]
        + (["--no-weighted"] if scale == "tiny" else ["--floor"])
        + (["--repeat", "3"] if scale in ("small", "medium") else []),
        "adjacency": size,
        "partition": size + (["--skip-dgl"] if scale == "large" else []),
        "sampling": size + ["--epochs", "1", "--repeat", str(s.train_repeat)],
        "train_vs_dgl": ["--nodes", str(min(s.nodes, 1_000_000)), "--edges", str(min(s.edges, 10_000_000))]
        + ["--epochs", str(s.train_epochs), "--repeat", str(s.train_repeat), "--fanouts", "15,10,5", "--hidden", "256"],
        # PyG, DGL and gnnflow on cora, citeseer and the generated graph (up to 1M nodes), alternating
        "frameworks": (["--graphs", "cora", "--planetoid-epochs", "2"] if scale == "tiny" else [])
        + ["--nodes", str(min(s.nodes, 1_000_000)), "--edges", str(min(s.edges, 10_000_000))]
        + ["--epochs", str(s.train_epochs), "--repeat", str(max(s.train_repeat, 1 if scale == "tiny" else 2))],
        "aggregate": ["--nodes", str(max(s.nodes // 10, 1000)), "--edges", str(max(s.edges * 9 // 10, 9000))],
        "bloom": ["--nodes", str(s.nodes), "--edges", str(s.edges), "--fpr-queries", str(min(s.edges, 1_000_000))],
        "accuracy": ["--parts", s.accuracy_parts, "--seeds", str(s.accuracy_seeds)],
        "compression": ["--datasets", *s.compression_datasets.split(","), "--seeds", str(s.accuracy_seeds)]
        + ["--fpr-queries", str(min(s.edges, 1_000_000))],
        "weighted": ["--seeds", str(s.accuracy_seeds)] + (["--parts", "gcn"] if s.accuracy_seeds == 1 else []),
        "placement": ["--graphs", s.placement_graphs, "--seeds", str(s.accuracy_seeds)],
        # the generated graph adjacency builds (its features file is written beside it once)
        "feature_cache": size + ["--cache", "0.1", "--batches", "5", "--warmup", "10"],
    }
    if name not in args:
        raise ValueError(f"unknown benchmark {name!r}; one of {BENCHMARKS}")
    return args[name] + ([] if name in ("aggregate", "bloom") else work)


@dataclass(kw_only=True)
class Record:
    """One comparison, ours against a peer measured in the same run."""

    benchmark: str = field(metadata={"help": "The script, benchmarks/<benchmark>.py."})
    stage: str = field(metadata={"help": "What was measured, e.g. 'ingest, sparse int64 ids'."})
    metric: str = field(metadata={"help": "Unit of ours/peer: 'seconds', 'seconds per epoch', 'test accuracy %'."})
    ours: float = field(metadata={"help": "Our value."})
    peer: float | None = field(metadata={"help": "The peer's value, measured in the same run; None: no peer."})
    peer_name: str = field(metadata={"help": "The peer, e.g. 'bare DuckDB SELECT DISTINCT' ('' without one)."})
    max_ratio: float | None = field(default=None, metadata={"help": "Target: ours / peer at most this."})
    min_ratio: float | None = field(default=None, metadata={"help": "Target: ours / peer at least this."})
    ours_rss_bytes: int | None = field(default=None, metadata={"help": "Our peak RSS, own child process."})
    peer_rss_bytes: int | None = field(default=None, metadata={"help": "The peer's peak RSS, own child process."})
    ours_cpu_seconds: float | None = field(
        default=None, metadata={"help": "Our user + system CPU seconds (all threads): steadier than wall time."}
    )
    peer_cpu_seconds: float | None = field(default=None, metadata={"help": "The peer's CPU seconds, likewise."})
    nodes: int | None = field(default=None, metadata={"help": "Nodes of the input graph."})
    edges: int | None = field(default=None, metadata={"help": "Edges of the input (the scale's edge rows)."})
    notes: str = field(default="", metadata={"help": "Anything a reader needs to read the figure right."})

    def __post_init__(self) -> None:
        for name in ("ours", "peer"):
            v = getattr(self, name)
            if (v is not None or name == "ours") and (not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise ValueError(f"Record {self.stage!r}: {name}={v!r} is not a finite number")
        if self.peer == 0:
            raise ValueError(f"Record {self.stage!r}: peer value 0 leaves no ratio")
        if self.peer is None and (self.max_ratio is not None or self.min_ratio is not None):
            raise ValueError(f"Record {self.stage!r}: a ratio target needs a peer value")

    @property
    def ratio(self) -> float | None:
        """ours / peer (None without a peer)."""
        return None if self.peer is None else self.ours / self.peer

    @property
    def met(self) -> bool | None:
        """Whether the ratio meets its target; None without one."""
        if self.ratio is None or (self.max_ratio is None and self.min_ratio is None):
            return None
        return (self.max_ratio is None or self.ratio <= self.max_ratio) and (
            self.min_ratio is None or self.ratio >= self.min_ratio
        )

    @property
    def target(self) -> str:
        parts = ([f">= {self.min_ratio:.3g}"] if self.min_ratio is not None else []) + (
            [f"<= {self.max_ratio:.3g}"] if self.max_ratio is not None else []
        )
        return " and ".join(parts)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"ratio": self.ratio, "target": self.target, "met": self.met}

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names - {"ratio", "target", "met"}
        if unknown:
            raise ValueError(f"record has unknown keys {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if k in names})


def emit(path: str | os.PathLike | None, records: list[Record]) -> None:
    """Append `records` to `path` as JSON lines (nothing when `path` is None)."""
    if path is None:
        return
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r.to_dict()) + "\n")


def read_records(path: str | os.PathLike) -> list[Record]:
    p = Path(path)
    if not p.is_file():
        return []
    return [Record.from_dict(json.loads(line)) for line in p.read_text().splitlines() if line.strip()]


def machine() -> dict:
    """The machine the figures come from (and how loaded it was when asked)."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


def describe_machine(m: dict) -> str:
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['memory_bytes'] / 2**30:.0f} GiB RAM, {m['system']}; "
        f"load average {' '.join(str(x) for x in m['load_average'])} at the start"
    )


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far, all threads."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _num(v: float) -> str:
    """4 significant digits; from 10,000 on, the whole number with thousands separators."""
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"


def _gb(v: int | None) -> str:
    return "—" if v is None else f"{v / 2**30:.2f}"


def _cpu(r: Record) -> str:
    if r.ours_cpu_seconds is None or not r.peer_cpu_seconds:
        return "—"
    return f"{r.ours_cpu_seconds:.2f} / {r.peer_cpu_seconds:.2f} ({r.ours_cpu_seconds / r.peer_cpu_seconds:.2f})"


def _cells(r: Record) -> list[str]:
    """A record's cells: stage, metric, ours, peer, ratio (✓ / ✗ against its target), target,
    peak RSS ours / peer, nodes / edges, CPU seconds ours / peer."""
    mark = {True: " ✓", False: " ✗", None: ""}[r.met]
    size = f"{r.nodes:,} / {r.edges:,}" if r.nodes is not None and r.edges is not None else "—"
    peer = "—" if r.peer is None else f"{_num(r.peer)} ({r.peer_name})"
    ratio = "—" if r.ratio is None else f"{r.ratio:.3f}{mark}"
    return [
        r.stage,
        r.metric,
        _num(r.ours),
        peer,
        ratio,
        r.target or "—",
        f"{_gb(r.ours_rss_bytes)} / {_gb(r.peer_rss_bytes)}",
        size,
        _cpu(r),
    ]


def markdown(results: dict) -> str:
    """The results table: stage, ours, peer, ratio, target, peak RSS ours / peer, size."""
    lines = [
        f"### `make bench SCALE={results['scale']}` — {results['date']}",
        "",
        f"Machine: {describe_machine(results['machine'])}.",
        "",
    ]
    for run in results.get("earlier_runs", []):
        lines += [
            f"Rows of {', '.join(run['benchmarks'])} from an earlier run, {run['date']}: "
            f"{describe_machine(run['machine'])}.",
            "",
        ]
    lines += [
        "| stage | metric | ours | peer | ratio ours/peer | target | peak RSS GB ours / peer | nodes / edges "
        "| CPU s ours / peer |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in results["records"]:
        lines.append("| " + " | ".join(_cells(Record.from_dict(d))) + " |")
    failed = [n for n, b in results["benchmarks"].items() if b["returncode"] != 0]
    if failed:
        lines += ["", f"Benchmarks that failed (no records): {', '.join(failed)}."]
    notes = [f"- {Record.from_dict(d).stage}: {d['notes']}" for d in results["records"] if d.get("notes")]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def _run_name(m: dict, date: str) -> str:
    """A run in a table cell: the CPU model without its trademark signs, and the day."""
    cpu = m["cpu"].replace("(R)", "").replace("(TM)", "").removesuffix(" Processor").strip()
    return f"{cpu}, {date[:10]}"


def render_markdown(scale: str, results_dir: str | os.PathLike = RESULTS_DIR) -> str:
    """BENCHMARKS.md's table of one scale, from `results_dir/<scale>.json`: every record with its
    run's machine and date (a results file merged by `make bench ONLY=...` holds rows of earlier
    runs, `merge_earlier`), then the records' notes. Days only: the file is no log."""
    results = read_results(Path(results_dir) / f"{scale}.json")
    earlier = {b: run for run in results.get("earlier_runs", []) for b in run["benchmarks"]}
    latest = {"machine": results["machine"], "date": results["date"]}
    latest["benchmarks"] = [b for b in results["benchmarks"] if b not in earlier]
    runs = [latest, *results.get("earlier_runs", [])]

    def run_of(benchmark: str) -> dict:
        return earlier.get(benchmark, latest)

    used = {id(run_of(d["benchmark"])) for d in results["records"]}
    size = scale_of(scale)
    lines = [
        f"Scale `{scale}` (`harness.SCALES`): the graph benchmarks' generated graph has {size.nodes:,} nodes / "
        f"{size.edges:,} edge rows; the nodes / edges column gives each row's input. Runs:",
        "",
    ]
    for run in runs:
        if id(run) in used:
            m = run["machine"]
            lines.append(
                f"- {_run_name(m, run['date'])} ({', '.join(run['benchmarks'])}): {m['cpu']}, {m['cores']} cores, "
                f"{m['memory_bytes'] / 2**30:.0f} GiB RAM, {m['system']}; load average "
                f"{' '.join(str(x) for x in m['load_average'])} at the start."
            )
    lines += [
        "",
        "| stage | metric | ours | peer | ratio ours/peer | target | peak RSS GB ours / peer | nodes / edges "
        "| CPU s ours / peer | run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in results["records"]:
        run = run_of(d["benchmark"])
        cells = _cells(Record.from_dict(d)) + [_run_name(run["machine"], run["date"])]
        lines.append("| " + " | ".join(cells) + " |")
    failed = [n for n, b in results["benchmarks"].items() if b["returncode"] != 0]
    if failed:
        lines += ["", f"Benchmarks that failed (no records): {', '.join(failed)}."]
    notes = [f"- {d['stage']}: {d['notes']}" for d in results["records"] if d.get("notes")]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


DOC = RESULTS_DIR.parents[1] / "BENCHMARKS.md"
# a region's markers each stand on a line of their own
_GENERATED = re.compile(r"^(<!-- generated: ([^\n]+?) -->\n)(.*?)^(<!-- end generated -->)$", re.DOTALL | re.MULTILINE)


def generated_block(source: str) -> str:
    """What the generated region `<!-- generated: SOURCE -->` holds: `benchmarks/harness.py SCALE`
    (`render_markdown`), `benchmarks/pipeline_run.py --table [--out FILE]` (its records' table) or
    `benchmarks/memory_wall.py --table` (the memory-wall run's tables)."""
    words = source.split()
    if words[:1] == ["benchmarks/harness.py"] and len(words) == 2:
        return render_markdown(words[1])
    if words[:2] == ["benchmarks/pipeline_run.py", "--table"]:
        import pipeline_run  # benchmarks/pipeline_run.py (it imports this module)

        out = pipeline_run.RESULTS
        if words[2:3] == ["--out"] and len(words) == 4:
            out = RESULTS_DIR.parents[1] / words[3]
        elif len(words) != 2:
            raise ValueError(f"generated region {source!r}: expected --out FILE")
        return pipeline_run.markdown_table(json.loads(out.read_text())) + "\n"
    if words == ["benchmarks/memory_wall.py", "--table"]:
        import memory_wall  # benchmarks/memory_wall.py (it imports this module, through pipeline_run)

        return memory_wall.tables(json.loads(memory_wall.RESULTS.read_text())) + "\n"
    raise ValueError(f"generated region {source!r}: unknown source")


def generated_regions(text: str) -> list[tuple[str, str]]:
    """(source, committed content) of every generated region of a document's text."""
    return [(m.group(2), m.group(3)) for m in _GENERATED.finditer(text)]


def update_doc(path: str | os.PathLike = DOC) -> list[str]:
    """Rewrite every generated region of `path` from its source; return the sources changed."""
    p = Path(path)
    text = p.read_text()
    changed = []

    def fill(m: re.Match) -> str:
        block = generated_block(m.group(2))
        if block != m.group(3):
            changed.append(m.group(2))
        return m.group(1) + block + m.group(4)

    new = _GENERATED.sub(fill, text)
    if new != text:
        p.write_text(new)
    return changed


def write_results(
    scale: str,
    records: list[Record],
    benchmarks: dict[str, dict],
    *,
    out_dir: str | os.PathLike = RESULTS_DIR,
    machine_facts: dict | None = None,
    date: str | None = None,
    earlier_runs: list[dict] | None = None,
) -> tuple[Path, Path]:
    """Write <out_dir>/<scale>.json and <scale>.md; return both paths. `machine_facts` and `date`
    are this run's; `earlier_runs` (`merge_earlier`) say where the rows kept from earlier runs came from."""
    results = {
        "schema_version": SCHEMA_VERSION,
        "scale": scale,
        "sizes": dataclasses.asdict(scale_of(scale)),
        "machine": machine_facts or machine(),
        "date": date or utc_now(),
        "benchmarks": benchmarks,
        "records": [r.to_dict() for r in records],
    }
    if earlier_runs:
        results["earlier_runs"] = earlier_runs
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"{scale}.json", out / f"{scale}.md"
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    md_path.write_text(markdown(results))
    return json_path, md_path


def render(path: str | os.PathLike) -> Path:
    """Rewrite the Markdown table next to a results json from the json (after a format change)."""
    md = Path(path).with_suffix(".md")
    md.write_text(markdown(read_results(path)))
    return md


def merge_earlier(
    before: dict, records: list[Record], benchmarks: dict[str, dict]
) -> tuple[list[Record], dict[str, dict], list[dict]]:
    """This run's `records` and per-benchmark status, with those of the other benchmarks in an
    earlier results file (`before`) kept in front; returns them and the earlier runs those kept
    rows came from (benchmarks, machine, date), for `write_results(earlier_runs=...)`. A run that
    measured every benchmark of the earlier file leaves no earlier run behind."""
    ran = set(benchmarks)
    kept = [Record.from_dict(d) for d in before["records"] if d["benchmark"] not in ran]
    status = {k: v for k, v in before["benchmarks"].items() if k not in ran} | benchmarks
    older = before.get("earlier_runs", [])
    from_older = {b for run in older for b in run["benchmarks"]}
    own = {"machine": before["machine"], "date": before["date"]}
    own["benchmarks"] = [b for b in before["benchmarks"] if b not in from_older]
    earlier = []
    for run in [own, *older]:  # newest first; each keeps the benchmarks this run did not measure again
        left = [b for b in run["benchmarks"] if b not in ran]
        if left:
            earlier.append({**run, "benchmarks": left})
    return kept + records, status, earlier


def read_results(path: str | os.PathLike) -> dict:
    results = json.loads(Path(path).read_text())
    if results.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {results.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    results["records"] = [Record.from_dict(d).to_dict() for d in results["records"]]
    return results


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of log(seconds) against log(edges) over (edges, seconds) points."""
    pts = [(math.log(e), math.log(s)) for e, s in points if e > 0 and s > 0]
    if len({x for x, _ in pts}) < 2:
        raise ValueError("a slope needs seconds at two or more sizes")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="BENCHMARKS.md's generated tables from benchmarks/results/.")
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", metavar="SCALE", choices=sorted(SCALES), help="print one scale's table")
    group.add_argument(
        "--update-doc", nargs="?", const=str(DOC), metavar="FILE", help="rewrite the generated regions (BENCHMARKS.md)"
    )
    args = ap.parse_args(argv)
    if args.markdown:
        sys.stdout.write(render_markdown(args.markdown))
        return 0
    changed = update_doc(args.update_doc)
    print(f"{args.update_doc}: " + (f"rewrote {', '.join(changed)}" if changed else "up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
