"""Dagster beyond one machine: run history in a real PostgreSQL server, the Kubernetes run
launcher's config, and the multi-node Kubernetes manifest (deploy/)."""

import glob
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage, dataset_partitions
from assets.metis_partitions import metis_partitions
from assets.normalized_adjacency import normalized_adjacency
from training.launch import LaunchConfig, torchrun_command

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"


# ----------------------------------------------------------------------------- PostgreSQL


def _pg_bindir() -> Path | None:
    """Debian's PostgreSQL binaries (not on PATH): /usr/lib/postgresql/<major>/bin, newest first."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of its own: initdb as the `postgres` user (initdb refuses root), the
    data folder outside pytest's 0700 temp root, a free port, its socket in a private folder."""
    pytest.importorskip("dagster_postgres", reason="dagster-postgres is not installed: pip install -e '.[scaleout]'")
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql; see README 'Scaling out')")
    as_postgres: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL as the postgres user")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    root = Path(tempfile.mkdtemp(prefix="gnnflow-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if as_postgres:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    port = _free_port()

    def run(*cmd: str) -> None:
        r = subprocess.run([*as_postgres, *cmd], capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)}: {r.stdout}{r.stderr}"

    run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1"
    run(str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "server.log"), "-w", "start")
    try:
        run(str(bindir / "createdb"), "-h", str(sock), "-p", str(port), "-U", "postgres", "dagster")
        yield {"port": port, "url": f"postgresql://postgres@127.0.0.1:{port}/dagster"}
    finally:
        subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
        shutil.rmtree(root, ignore_errors=True)


def test_run_history_lives_in_postgres(postgres, shared_datasets, tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    # the shipped instance file, its credentials from the environment
    shutil.copy(DEPLOY / "dagster-postgres.yaml", home / "dagster.yaml")
    env = {
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": str(postgres["port"]),
        "DAGSTER_PG_USERNAME": "postgres",
        "DAGSTER_PG_PASSWORD": "unused-with-trust-auth",
        "DAGSTER_PG_DB": "dagster",
        "DAGSTER_HOME": str(home),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage

    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        instance.add_dynamic_partitions(dataset_partitions.name, ["cora"])
        storage = GnnflowStorage(home=str(tmp_path / "gnnflow"), landing=str(shared_datasets))
        result = dg.materialize(
            [canonical_graph, normalized_adjacency, metis_partitions],
            partition_key="cora",
            instance=instance,
            resources={"storage": storage},
            run_config={"ops": {"metis_partitions": {"config": {"num_parts": 2, "write_distdgl": False}}}},
        )
        assert result.success
        run_id = result.run_id

    # a new instance (as another process or machine would) reads the history back from the server
    with dg.DagsterInstance.get() as again:
        runs = again.get_runs()
        assert [r.run_id for r in runs] == [run_id]
        assert runs[0].status == dg.DagsterRunStatus.SUCCESS
        assert again.get_dynamic_partitions(dataset_partitions.name) == ["cora"]
        for asset in ("canonical_graph", "normalized_adjacency", "metis_partitions"):
            event = again.get_latest_materialization_event(dg.AssetKey(asset))
            assert event is not None and event.run_id == run_id
            assert event.asset_materialization.partition == "cora"
        nodes = again.get_latest_materialization_event(dg.AssetKey("canonical_graph")).asset_materialization
        assert nodes.metadata["nodes"].value == 2708
    # and the rows are in PostgreSQL itself, not in a local file
    import psycopg2

    with psycopg2.connect(postgres["url"]) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id, status FROM runs")
        assert cur.fetchall() == [(run_id, "SUCCESS")]
    assert not list(home.rglob("*.db"))


# ----------------------------------------------------------------------------- Kubernetes


DUMMY_KUBECONFIG = """
apiVersion: v1
kind: Config
clusters:
  - name: dummy
    cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
  - name: dummy
    user: {token: not-a-real-token}
contexts:
  - name: dummy
    context: {cluster: dummy, user: dummy, namespace: gnnflow}
current-context: dummy
"""


def test_k8s_run_launcher_config_loads_and_validates(tmp_path, monkeypatch):
    pytest.importorskip("dagster_k8s", reason="dagster-k8s is not installed: pip install -e '.[scaleout]'")
    pytest.importorskip("dagster_postgres", reason="dagster-postgres is not installed: pip install -e '.[scaleout]'")
    from dagster_k8s import K8sRunLauncher

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(DUMMY_KUBECONFIG)
    config = yaml.safe_load((DEPLOY / "k8s" / "dagster.yaml").read_text())
    # outside a cluster: the dummy kubeconfig instead of the in-cluster service account
    config["run_launcher"]["config"].update({"load_incluster_config": False, "kubeconfig_file": str(kubeconfig)})
    home = tmp_path / "home"
    home.mkdir()
    for name in ("DAGSTER_PG_HOST", "DAGSTER_PG_USERNAME", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB"):
        monkeypatch.setenv(name, "x")
    # the run launcher alone (the storage would connect to PostgreSQL at once)
    (home / "dagster.yaml").write_text(yaml.safe_dump({"run_launcher": config["run_launcher"]}))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        launcher = instance.run_launcher
        assert isinstance(launcher, K8sRunLauncher)
        assert launcher.job_namespace == "gnnflow" and launcher.job_image == "registry.example.com/gnnflow:latest"
        assert launcher.instance_config_map == "dagster-instance"
        assert "GNNFLOW_HOME=/data/gnnflow" in launcher.env_vars
    # a wrong field is refused by the launcher's config schema, naming it
    config["run_launcher"]["config"]["job_namespaces"] = "typo"
    (home / "dagster.yaml").write_text(yaml.safe_dump({"run_launcher": config["run_launcher"]}))
    with pytest.raises(dg.DagsterInvalidConfigError, match="job_namespaces"):
        dg.DagsterInstance.from_config(str(home)).run_launcher  # noqa: B018
    # the storage block is a valid dagster-postgres config too
    from dagster_postgres.utils import pg_config

    result = dg._config.validate_config(pg_config(), config["storage"]["postgres"])
    assert result.success, result.errors


def test_multinode_manifest_runs_the_launch_command():
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "torchrun-indexed-job.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Service", "Job"}
    svc, job = kinds["Service"], kinds["Job"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"] and svc["spec"]["clusterIP"] == "None"
    (container,) = pod["containers"]
    script = container["args"][0]
    args = shlex.split(script.split("exec ", 1)[1].replace('"$RUN_YAML"', "RUN_YAML"))
    nnodes = spec["completions"]
    endpoint = f"{job['metadata']['name']}-0.{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
    nproc = int(container["resources"]["limits"]["nvidia.com/gpu"])
    ours = torchrun_command(nproc, "RUN_YAML", LaunchConfig(nnodes=nnodes, rdzv_endpoint=endpoint), is_host=False)
    ours = ["torchrun", *ours[ours.index(f"--nnodes={nnodes}") :]]
    # the same command, with the host flag and the pod's address filled in by the shell
    expected = [a.replace("is_host=0", "is_host=$HOST") for a in ours]
    expected.insert(expected.index("-m"), "--local-addr=$POD_IP")
    assert args == expected
    env = {e["name"] for e in container["env"]}
    assert {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "POD_IP", "RUN_YAML"} <= env


def test_trained_model_pod_through_pipes_k8s_client(tmp_path):
    pytest.importorskip("dagster_k8s", reason="dagster-k8s is not installed: pip install -e '.[scaleout]'")
    from dagster_k8s import PipesK8sClient

    from assets.trained_model import k8s_pipes_run

    with pytest.raises(ValueError, match="k8s_image"):
        LaunchConfig(runner="k8s")
    launch = LaunchConfig(
        runner="k8s", k8s_image="reg/gnnflow:1", k8s_namespace="ml", k8s_volume_claim="data", k8s_gpus=4
    )
    home = tmp_path / "home"
    client, kw = k8s_pipes_run(launch, 4, home / "cora" / "run.yaml", {"OMP_NUM_THREADS": "4"}, home)
    assert isinstance(client, PipesK8sClient)
    assert kw["command"] == torchrun_command(4, home / "cora" / "run.yaml", executable="python")
    assert kw["command"][:4] == ["python", "-m", "training.launch", "--nproc-per-node=4"]
    assert (kw["image"], kw["namespace"], kw["env"]) == ("reg/gnnflow:1", "ml", {"OMP_NUM_THREADS": "4"})
    (container,) = kw["base_pod_spec"]["containers"]
    assert container["volume_mounts"] == [{"name": "gnnflow-home", "mount_path": str(home)}]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert kw["base_pod_spec"]["volumes"][0]["persistent_volume_claim"] == {"claim_name": "data"}
    multi = LaunchConfig(runner="k8s", k8s_image="i", nnodes=2, rdzv_endpoint="h:1")
    with pytest.raises(dg.Failure, match="torchrun-indexed-job.yaml"):
        k8s_pipes_run(multi, 1, home / "run.yaml", {}, home)
