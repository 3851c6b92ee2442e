"""The torchrun command that launches training: one node (``--standalone``) or N nodes.

One node::

    torchrun --standalone --nproc-per-node P -m training --config run.yaml

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
canonical graph (a shared filesystem); rank 0 (on node 0) writes the outputs.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LaunchConfig", "launch_env", "other_node_command", "torchrun_command"]

RUNNERS = ("subprocess", "k8s")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-]*$|^\[[0-9A-Fa-f:]+\]$")
_TOKEN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass(kw_only=True)
class LaunchConfig:
    """How torchrun launches training: nodes, processes per node, rendezvous."""

    nnodes: int = field(default=1, metadata={"help": "Nodes (machines); 1 = torchrun --standalone."})
    nproc_per_node: int = field(
        default=0,
        metadata={
            "help": "Processes per node; 0 = the shards' world size / nnodes (on GPUs at most the visible GPUs). "
            "nnodes * nproc_per_node must divide the shards' world size."
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
        metadata={"help": "Network interface for gloo/NCCL (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME); '' = default."},
    )
    runner: str = field(
        default="subprocess",
        metadata={
            "help": f"Where node 0's torchrun runs, one of {RUNNERS}: 'subprocess' on this machine "
            "(dagster-pipes PipesSubprocessClient), 'k8s' in one Kubernetes pod (dagster-k8s PipesK8sClient, "
            "[scaleout] extra) from k8s_image, with k8s_volume_claim mounted where GNNFLOW_HOME is here."
        },
    )
    k8s_image: str = field(default="", metadata={"help": "runner 'k8s': the gnnflow image of the pod."})
    k8s_namespace: str = field(default="default", metadata={"help": "runner 'k8s': the pod's namespace."})
    k8s_volume_claim: str = field(
        default="",
        metadata={"help": "runner 'k8s': PersistentVolumeClaim holding GNNFLOW_HOME, mounted at the same path."},
    )
    k8s_gpus: int = field(default=0, metadata={"help": "runner 'k8s': nvidia.com/gpu limit of the pod."})

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"launch.nnodes={self.nnodes} must be at least 1")
        if self.nproc_per_node < 0:
            raise ValueError(f"launch.nproc_per_node={self.nproc_per_node} must be >= 0 (0 = automatic)")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(f"launch.nnodes={self.nnodes} needs launch.rdzv_endpoint (HOST:PORT of node 0)")
        if self.rdzv_endpoint:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not _HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(
                    f"launch.rdzv_endpoint={self.rdzv_endpoint!r}: expected HOST:PORT, e.g. 10.0.0.1:29400"
                )
        if self.local_addr and not _HOST.match(self.local_addr):
            raise ValueError(f"launch.local_addr={self.local_addr!r}: expected a host name or IP address")
        for name in ("rdzv_id", "socket_ifname"):
            value = getattr(self, name)
            if value and not _TOKEN.match(value):
                raise ValueError(f"launch.{name}={value!r}: letters, digits, '_', '.', '-' only (at most 64)")
        if not self.rdzv_id:
            raise ValueError("launch.rdzv_id must not be empty")
        if self.runner not in RUNNERS:
            raise ValueError(f"launch.runner={self.runner!r} is not one of {RUNNERS}")
        if self.runner == "k8s" and not self.k8s_image:
            raise ValueError("launch.runner='k8s' needs launch.k8s_image (the gnnflow image)")
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
    """The torchrun argv (this venv's torchrun, or `executable`) for one node of the run.

    `is_host`: this node hosts the rendezvous (node 0); `local_addr` overrides
    ``launch.local_addr`` (the other nodes each give their own).
    """
    launch = launch or LaunchConfig()
    launcher = [executable] if executable else _launcher()
    tail = ["-m", "training", "--config", str(config_path)]
    if launch.nnodes == 1:
        return [*launcher, "--standalone", f"--nproc-per-node={nproc}", *tail]
    addr = launch.local_addr if local_addr is None else local_addr
    if addr and not _HOST.match(addr):
        raise ValueError(f"local_addr={addr!r}: expected a host name or IP address")
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
    """Environment variables the launch needs (the socket interface of gloo and NCCL)."""
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
