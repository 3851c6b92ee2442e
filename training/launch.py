"""The command that launches training: one node (``python -m training.launch``) or N nodes (torchrun).

One node::

    python -m training.launch --nproc-per-node P -m training --config run.yaml

This is torchrun's own launcher (`torch.distributed.run`: the same arguments, the same
supervision of the ranks and the same failure report) with a rendezvous held in the
launcher's memory instead of torchrun's TCP store, which on torch 2.2 listens on every
interface (even ``--standalone``) and takes anyone's writes. Nothing of a one-node run
listens beyond loopback: the launcher opens no port, rank 0 serves the process group's
store on 127.0.0.1 only (`training.distributed`), and gloo and NCCL use the loopback
interface. The launcher also holds the dataset lock descriptor the trained_model step
hands it (``GNNFLOW_LOCK_FD``) and lives no longer than that step (`training.lifetime`).

N nodes (c10d rendezvous on node 0; every node runs the same command, node 0 with
``is_host=1``)::

    GLOO_SOCKET_IFNAME=eth0 torchrun --nnodes N --nproc-per-node P --rdzv-backend c10d \\
        --rdzv-endpoint HOST:PORT --rdzv-id gnnflow --rdzv-conf is_host=1 --local-addr ADDR \\
        -m training --config run.yaml

Why the extras (checked with two hosts in network namespaces, tests/test_multinode.py):
torchrun decides which node hosts the rendezvous store by comparing host names, which is
ambiguous when nodes share one (containers, namespaces), so the host says ``is_host=1`` and
the others ``is_host=0``; ``--local-addr`` is the address the other nodes reach this one
at; and gloo binds to the interface of ``GLOO_SOCKET_IFNAME`` (NCCL to that of
``NCCL_SOCKET_IFNAME``), without which it may pick an address the other nodes cannot
reach and both nodes time out. Every node must see the same run.yaml, shards and
canonical graph (a shared filesystem); rank 0 (on node 0) writes the outputs. The
rendezvous and rank 0's store listen on the network: run several nodes on a private one.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from graphs.infra.config_checks import MAX_RANKS, bounded_repr, check_fields
from training.lifetime import LAUNCHER_PID_ENV, die_with_parent

__all__ = ["LOCK_FD_ENV", "LaunchConfig", "launch_env", "main", "other_node_command", "torchrun_command"]

RUNNERS = ("subprocess", "k8s")
LOCK_FD_ENV = "GNNFLOW_LOCK_FD"  # the dataset lock's descriptor the step hands the one-node launcher
# every pattern is matched whole (re.fullmatch): "$" would also accept a trailing newline
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.\-]{0,252}|\[[0-9A-Fa-f:]{2,39}\]")
_PORT = re.compile(r"[0-9]{1,5}")
_TOKEN = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_K8S_NAME = re.compile(r"[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?")  # a namespace or claim: an RFC 1123 label
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-/:@]{0,254}")
_RENDEZVOUS = "in-process"  # the one-node launcher's rendezvous backend
# torchrun options the one-node launcher sets (a user's would reopen the network)
# torchrun's settings the one-node launcher fixes (`_FIXED_ARGS`); a command line may set no other value
_FIXED_ARGS = ("--nnodes=1", f"--rdzv-backend={_RENDEZVOUS}", "--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1")
_FIXED_SETTINGS = (
    "standalone",
    "nnodes",
    "node_rank",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "rdzv_conf",
    "master_addr",
    "master_port",
    "local_addr",
)


@dataclass(kw_only=True)
class LaunchConfig:
    """How training is launched: nodes, processes per node, rendezvous."""

    nnodes: int = field(
        default=1,
        metadata={
            "max": MAX_RANKS,
            "help": "Nodes (machines); 1 = python -m training.launch (torchrun's launcher, loopback only).",
        },
    )
    nproc_per_node: int = field(
        default=0,
        metadata={
            "max": MAX_RANKS,
            "help": "Processes per node; 0 = the shards' world size / nnodes (on GPUs at most the visible GPUs). "
            "nnodes * nproc_per_node must divide the shards' world size.",
        },
    )
    rdzv_endpoint: str = field(
        default="",
        metadata={"help": "HOST:PORT of the c10d rendezvous on node 0 (nnodes > 1): an address every node reaches."},
    )
    rdzv_id: str = field(default="gnnflow", metadata={"help": "Rendezvous id, the same on every node of one run."})
    local_addr: str = field(
        default="",
        metadata={"help": "This node's address as the other nodes reach it (torchrun --local-addr); '' = default."},
    )
    socket_ifname: str = field(
        default="",
        metadata={
            "help": "Network interface for gloo/NCCL (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) with nnodes > 1; "
            "'' = default. One node always uses loopback."
        },
    )
    runner: str = field(
        default="subprocess",
        metadata={
            "help": f"Where node 0's launcher runs, one of {RUNNERS}: 'subprocess' on this machine "
            "(through dagster-pipes, tied to the step), 'k8s' in one Kubernetes pod (dagster-k8s PipesK8sClient, "
            "[scaleout] extra) from k8s_image, with k8s_volume_claim mounted where GNNFLOW_HOME is here."
        },
    )
    k8s_image: str = field(default="", metadata={"help": "runner 'k8s': the gnnflow image of the pod."})
    k8s_namespace: str = field(default="default", metadata={"help": "runner 'k8s': the pod's namespace."})
    k8s_volume_claim: str = field(
        default="",
        metadata={"help": "runner 'k8s': PersistentVolumeClaim holding GNNFLOW_HOME, mounted at the same path."},
    )
    k8s_gpus: int = field(
        default=0, metadata={"max": MAX_RANKS, "help": "runner 'k8s': nvidia.com/gpu limit of the pod."}
    )

    def __post_init__(self) -> None:
        check_fields(self, "launch")
        if self.nnodes < 1:
            raise ValueError(f"launch.nnodes={self.nnodes} must be at least 1")
        if self.nproc_per_node < 0:
            raise ValueError(f"launch.nproc_per_node={self.nproc_per_node} must be >= 0 (0 = automatic)")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(f"launch.nnodes={self.nnodes} needs launch.rdzv_endpoint (HOST:PORT of node 0)")
        if self.nnodes == 1 and self.socket_ifname:
            raise ValueError(
                f"launch.socket_ifname={bounded_repr(self.socket_ifname)} applies to several nodes (nnodes > 1); "
                "the processes of one node talk over loopback only: remove it"
            )
        if self.rdzv_endpoint:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not _HOST.fullmatch(host) or not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
                raise ValueError(
                    f"launch.rdzv_endpoint={bounded_repr(self.rdzv_endpoint)}: expected HOST:PORT, e.g. 10.0.0.1:29400"
                )
        if self.local_addr and not _HOST.fullmatch(self.local_addr):
            raise ValueError(f"launch.local_addr={bounded_repr(self.local_addr)}: expected a host name or IP address")
        for name in ("rdzv_id", "socket_ifname"):
            value = getattr(self, name)
            if value and not _TOKEN.fullmatch(value):
                raise ValueError(
                    f"launch.{name}={bounded_repr(value)}: letters, digits, '_', '.', '-' only (at most 64)"
                )
        if not self.rdzv_id:
            raise ValueError("launch.rdzv_id must not be empty")
        if self.runner not in RUNNERS:
            raise ValueError(f"launch.runner={bounded_repr(self.runner)} is not one of {RUNNERS}")
        self._check_k8s()

    def _check_k8s(self) -> None:
        if self.runner == "k8s" and not self.k8s_image:
            raise ValueError("launch.runner='k8s' needs launch.k8s_image (the gnnflow image)")
        if self.k8s_image and not _IMAGE.fullmatch(self.k8s_image):
            raise ValueError(
                f"launch.k8s_image={bounded_repr(self.k8s_image)}: expected an image reference such as "
                "registry/gnnflow:1 (letters, digits, '.', '_', '-', '/', ':', '@')"
            )
        for name in ("k8s_namespace", "k8s_volume_claim"):
            value = getattr(self, name)
            if value and not _K8S_NAME.fullmatch(value):
                raise ValueError(
                    f"launch.{name}={bounded_repr(value)}: a Kubernetes name: lower-case letters, digits and '-', "
                    "at most 63, starting and ending with a letter or digit"
                )
        if self.k8s_gpus < 0:
            raise ValueError(f"launch.k8s_gpus={self.k8s_gpus} must be >= 0")


def _launcher() -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "torch.distributed.run"]


def torchrun_command(
    nproc: int,
    config_path: str | os.PathLike,
    launch: LaunchConfig | None = None,
    *,
    is_host: bool = True,
    local_addr: str | None = None,
    executable: str | None = None,
) -> list[str]:
    """The argv that launches one node of the run: one node, ``python -m training.launch``
    (this interpreter, or `executable`); N nodes, torchrun (this venv's, or `executable`).

    `is_host`: this node hosts the rendezvous (node 0); `local_addr` overrides
    ``launch.local_addr`` (the other nodes each give their own).
    """
    launch = launch or LaunchConfig()
    tail = ["-m", "training", "--config", str(config_path)]
    if launch.nnodes == 1:
        return [executable or sys.executable, "-m", "training.launch", f"--nproc-per-node={nproc}", *tail]
    launcher = [executable] if executable else _launcher()
    addr = launch.local_addr if local_addr is None else local_addr
    if addr and not _HOST.fullmatch(addr):
        raise ValueError(f"local_addr={bounded_repr(addr)}: expected a host name or IP address")
    cmd = [
        *launcher,
        f"--nnodes={launch.nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={launch.rdzv_endpoint}",
        f"--rdzv-id={launch.rdzv_id}",
        f"--rdzv-conf=is_host={1 if is_host else 0}",
    ]
    if addr:
        cmd.append(f"--local-addr={addr}")
    return [*cmd, *tail]


def launch_env(launch: LaunchConfig | None) -> dict[str, str]:
    """Environment variables the launch needs (the socket interface of gloo and NCCL across nodes;
    one node's ranks choose loopback themselves, `training.distributed`)."""
    if launch is None or not launch.socket_ifname:
        return {}
    return {"GLOO_SOCKET_IFNAME": launch.socket_ifname, "NCCL_SOCKET_IFNAME": launch.socket_ifname}


def other_node_command(nproc: int, config_path: str | os.PathLike, launch: LaunchConfig) -> str:
    """The shell line to run on every other node, with ADDR for that node's own address."""
    args = torchrun_command(nproc, config_path, launch, is_host=False, local_addr="", executable="torchrun")[1:]
    split = args.index("-m")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in launch_env(launch).items())
    line = f"torchrun {shlex.join(args[:split])} --local-addr=ADDR {shlex.join(args[split:])}"
    return f"{env} {line}".strip()


# ----------------------------------------------------------------------------- the one-node launcher


def _free_loopback_port() -> int:
    """A port free on 127.0.0.1 now (rank 0 serves the process group's store there)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _in_process_rendezvous(params):
    """torchrun's rendezvous for one node: a store in the launcher's memory (no socket), this
    node alone (group rank 0 of 1), never waiting for more."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousHandler

    class InProcessRendezvous(RendezvousHandler):
        def __init__(self) -> None:
            self._store, self._closed = dist.HashStore(), False

        def get_backend(self) -> str:
            return _RENDEZVOUS

        def next_rendezvous(self):
            try:  # torch >= 2.4: the workers' MASTER_ADDR / MASTER_PORT come with the rendezvous
                from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo
            except ImportError:  # torch 2.2: (store, rank, world size); the agent picks the port
                return self._store, 0, 1
            return RendezvousInfo(self._store, 0, 1, RendezvousStoreInfo("127.0.0.1", _free_loopback_port()))

        def is_closed(self) -> bool:
            return self._closed

        def set_closed(self) -> None:
            self._closed = True

        def num_nodes_waiting(self) -> int:
            return 0

        def get_run_id(self) -> str:
            return params.run_id

        def shutdown(self) -> bool:
            return True

    return InProcessRendezvous()


def _hold_inherited_lock() -> None:
    """Hold the dataset lock whose descriptor the step passed (`LOCK_FD_ENV`), for as long as this
    launcher lives; it is the step's own lock, so taking it succeeds at once."""
    import fcntl

    value = os.environ.pop(LOCK_FD_ENV, "")  # not the ranks': they do not inherit the descriptor
    if not value:
        return
    try:
        fd = int(value)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (ValueError, OSError) as exc:
        raise SystemExit(
            f"{LOCK_FD_ENV}={bounded_repr(value)} is not a dataset lock held for this launcher: {exc}"
        ) from None
    os.set_inheritable(fd, False)


def _own_options(args: list[str]) -> list[str]:
    """`args` for torchrun; SystemExit naming the settings they would change that make this
    launcher's rendezvous (read as torchrun reads them: abbreviations and ``_`` spellings too)."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    fixed = vars(parser.parse_args([*_FIXED_ARGS, "-m", "x"]))
    given = vars(parser.parse_args([*_FIXED_ARGS, *args]))
    changed = sorted(k for k in _FIXED_SETTINGS if given[k] != fixed[k])
    if changed:
        raise SystemExit(
            f"python -m training.launch: remove the options setting {', '.join(changed)}: it runs one node with its "
            "own rendezvous on loopback; for several nodes run torchrun with a c10d rendezvous (training/launch.py)"
        )
    return args


def main(argv: list[str] | None = None) -> None:
    """``python -m training.launch [torchrun options] -m training --config run.yaml``: torchrun
    on this node alone, on loopback, tied to the process that started it."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.run import main as torchrun_main

    args = _own_options(sys.argv[1:] if argv is None else argv)
    if not die_with_parent():
        raise SystemExit("python -m training.launch: the process that started it is gone")
    _hold_inherited_lock()
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # the ranks tie themselves to this process
    rendezvous_handler_registry.register(_RENDEZVOUS, _in_process_rendezvous)
    torchrun_main([*_FIXED_ARGS, *args])


if __name__ == "__main__":
    main()
