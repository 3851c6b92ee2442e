"""benchmarks/gpu_check.py runs on CPU (both precisions, without DGL), and the nsys wrapper
keeps its report although rank 0 removes the work folder (a stand-in `nsys` on PATH)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from assets import trained_model as tm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402  (benchmarks/gpu_check.py)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    data = tmp_path_factory.mktemp("gpu_check") / "data"
    made = gpu_check.make_inputs(data, nodes=400, edges=3000)
    assert 0 < made["shard_mb"] < made["input_mb"] < 50
    return data


def test_gpu_check_passes_on_cpu_without_dgl(inputs, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--data", str(inputs)]
        + ["--epochs", "3", "--out", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    result = json.loads(line)
    assert result["passed"] and not result["made_inputs"] and result["dgl_importable_in_runs"] is False
    assert set(result["runs"]) == set(gpu_check.RUNS)
    for name, run in result["runs"].items():
        assert run["ok"], run.get("error")
        precision, conv, shards, settings = gpu_check.RUNS[name]
        assert run["precision"] == gpu_check.PRECISIONS[precision] and run["conv"] == conv
        manifest = json.loads((inputs / run["shards"] / "manifest.json").read_text())
        # the default shards store Â's factors; the INT8 ones INT8 weights and compressed_graph's codes
        assert manifest["weight_encoding"] == ("int8" if shards == "int8" else "factors")
        assert manifest["features"]["encoding"] == ("compressed" if shards == "int8" else "fp32")
        assert len(run["losses"]) == 3 and run["losses"][-1] < run["losses"][0]
        assert run["step_ms"] > 0 and run["peak_mem_mb"] > 0 and 0.0 <= run["overlap"] <= 1.0
        summary = json.loads((tmp_path / "runs" / f"trained-{name}" / "summary.json").read_text())
        assert summary["test_acc_at_best_val"] == pytest.approx(run["test_acc"])
        # the run through the feature cache's tiers: the hot ones served rows (on the device on a GPU)
        assert (run.get("feature_cache_hot_hit_rate", 0) > 0) == ("feature_cache_hot" in settings)


def test_gpu_check_child_cannot_import_dgl():
    # the prelude that runs `python -m training` makes `import dgl` fail in the child
    blocked = subprocess.run(
        [sys.executable, "-c", gpu_check._NO_DGL.replace("runpy.run_module", "import dgl; runpy.run_module")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert blocked.returncode != 0 and "ModuleNotFoundError" in blocked.stderr and "dgl" in blocked.stderr


STAND_IN_NSYS = """#!{python}
# stand-in for `nsys profile ... -o REPORT command...`: runs the command, writes REPORT.nsys-rep at exit
import pathlib, subprocess, sys
args = sys.argv[2:]
i = args.index("-o")
rc = subprocess.call(args[i + 2 :])
pathlib.Path(args[i + 1] + ".nsys-rep").write_text("stand-in report, rc=%d\\n" % rc)
sys.exit(rc)
"""


def test_nsys_report_survives_the_work_folder_removal(inputs, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nsys = bin_dir / "nsys"
    nsys.write_text(STAND_IN_NSYS.format(python=sys.executable))
    nsys.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    out = tmp_path / "home" / "trained_model"
    work = out.parent / ".trained_model.work-0123456789abcdef"
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(
        yaml.safe_dump(
            {
                "model": {"conv": "sage", "hidden": 16, "num_layers": 2},
                "training": {"epochs": 1, "profiler": "nsys", "device": "cpu"},
                "paths": {"shards": str(inputs / "minibatch_shards"), "out": str(out), "work": str(work)},
            }
        )
    )
    work.mkdir(parents=True)
    tm.nsys_dir_for(work).mkdir()
    command, note = tm.nsys_wrap(
        [sys.executable, "-m", "training", "--config", str(run_yaml)], tm.nsys_dir_for(work) / "trained_model"
    )
    assert command[0] == str(nsys) and note.startswith("profiled with nsys")
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not work.exists()  # rank 0 removed its work folder on success ...
    assert tm.keep_nsys_report(tm.nsys_dir_for(work), out) == ["trained_model.nsys-rep"]
    report = out / "profile" / "nsys" / "trained_model.nsys-rep"
    assert report.read_text() == "stand-in report, rc=0\n"  # ... and nsys's report, written after, is kept
    assert not tm.nsys_dir_for(work).exists()
