"""Starting DistDGL on its machines: the cluster settings, one script per machine, and the wait.

The ``distdgl_model`` asset (`assets.distdgl_model`) trains with one machine per part of
metis_partitions' DistDGL export. For each machine it builds a *machine script*
(:func:`machine_script`): a POSIX sh script made of validated values only, each one
shell-quoted, that changes into the repository, starts the machine's servers and trainers
(``python -m training.distdgl``, every flag spelled out by
`training.distdgl_config.process_args`) in the background with their output in the log folder,
watches them all, and as soon as one fails stops the others and exits with its status (0 once
every one has ended with 0; each process's status is ``logs/machine{m}-{role}{i}.exit``).
Every process it starts dies with it (`training.distdgl.TIED_ENV`).

How a script reaches its machine is ``cluster.launcher`` (:func:`machine_command`):

- ``local``: ``sh -c SCRIPT`` on this machine, for one machine (``hosts`` empty or one
  address). DGL tells machines apart by IP address and names its shared memory after the
  graph, so two machines cannot share one host.
- ``ssh``: ``ssh -tt -o BatchMode=yes HOST SCRIPT`` for every machine, machine 0 included,
  as DGL's own launch tool does: each host must reach this one's repository, its Python
  environment and GNNFLOW_HOME at the same paths (a shared file system), and accept this
  host's key without a password. Ending the connection (the step ends or is stopped) hangs
  up the remote shell, and with it the processes it started.

:func:`run_machines` starts every machine's command tied to this process
(`training.lifetime.tied_process`), waits until all end, and stops the others as soon as one
fails (its peers would otherwise wait for it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Sequence

from graphs.infra.config_checks import MAX_RANKS, bounded_repr, check_fields
from training.distdgl import TIED_ENV
from training.distdgl_config import DistDGLConfig, DistDGLProcesses, DistDGLTraining, process_args
from training.lifetime import tied_process

__all__ = [
    "LAUNCHERS",
    "DistDGLCluster",
    "machine_command",
    "machine_script",
    "run_machines",
    "write_ip_config",
]

LAUNCHERS = ("local", "ssh")
LOOPBACK = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[1]
_IFNAME = re.compile(r"[A-Za-z0-9_.\-]{1,15}")


@dataclass(kw_only=True)
class DistDGLCluster(DistDGLProcesses):
    """The machines DistDGL trains on (one per part of metis_partitions) and how their
    processes are started (`training.distdgl_cluster`)."""

    PREFIX: ClassVar[str] = "cluster"

    hosts: list[str] = field(
        default_factory=list,
        metadata={
            "max_len": MAX_RANKS,
            "help": "IPv4 address of each machine; machine m serves part m. Empty: this machine alone "
            f"({LOOPBACK}), for a metis_partitions of one part.",
        },
    )
    server_port: int = field(default=30050, metadata={"max": 65535, "help": "TCP port of the DGL servers."})
    launcher: str = field(
        default="local",
        metadata={
            "help": f"How each machine's processes start, one of {LAUNCHERS}: 'local' here (one machine), "
            "'ssh' on every host (same paths everywhere: see training/distdgl_cluster.py)."
        },
    )
    socket_ifname: str = field(
        default="",
        metadata={"help": "Network interface the machines reach each other on (GLOO_SOCKET_IFNAME); '' = default."},
    )
    threads: int = field(
        default=0, metadata={"max": 4096, "help": "Threads per process (OMP_NUM_THREADS); 0 = cores / processes."}
    )

    def __post_init__(self) -> None:
        check_fields(self, self.PREFIX)
        self.check_processes()
        for i, host in enumerate(self.hosts):
            try:
                ipaddress.IPv4Address(host)  # DGL's ip_config and the trainers' tcp:// address take IPv4
            except ValueError:
                raise ValueError(f"cluster.hosts[{i}]={bounded_repr(host)}: expected an IPv4 address") from None
        if len(set(self.hosts)) != len(self.hosts):
            raise ValueError(f"cluster.hosts={bounded_repr(self.hosts)} lists a machine twice")
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"cluster.launcher={bounded_repr(self.launcher)} is not one of {LAUNCHERS}")
        if self.launcher == "local" and len(self.hosts) > 1:
            raise ValueError(
                f"cluster.launcher='local' starts one machine (this one), but cluster.hosts lists {len(self.hosts)}: "
                "use launcher 'ssh'"
            )
        if not 0 < self.server_port < 65536:
            raise ValueError(f"cluster.server_port={self.server_port} is not a TCP port")
        if self.socket_ifname and not _IFNAME.fullmatch(self.socket_ifname):
            raise ValueError(f"cluster.socket_ifname={bounded_repr(self.socket_ifname)} is not an interface name")
        if self.threads < 0:
            raise ValueError(f"cluster.threads={self.threads} must be >= 0 (0: automatic)")

    @property
    def addresses(self) -> list[str]:
        """Machine m's address is line m: the hosts, or this machine alone."""
        return list(self.hosts) or [LOOPBACK]


def write_ip_config(cluster: DistDGLCluster, path: str | os.PathLike) -> Path:
    """DGL's ip_config (one 'IP PORT' line per machine) at `path`."""
    path = Path(path)
    path.write_text("".join(f"{ip} {cluster.server_port}\n" for ip in cluster.addresses))
    return path


def _threads(cluster: DistDGLCluster) -> int:
    return cluster.threads or max(1, (os.cpu_count() or 1) // (cluster.servers + cluster.trainers))


def machine_script(
    cluster: DistDGLCluster,
    training: DistDGLTraining,
    machine: int,
    *,
    ip_config: str | os.PathLike,
    part_config: str | os.PathLike,
    out: str | os.PathLike,
    logs: str | os.PathLike,
) -> str:
    """The sh script of one machine (module docstring); its processes log to
    ``logs/machine{m}-{role}{i}.log``."""
    if not 0 <= machine < len(cluster.addresses):
        raise ValueError(f"machine={machine} but the cluster has {len(cluster.addresses)} machines")
    q = shlex.quote
    env = {"OMP_NUM_THREADS": str(_threads(cluster)), "DGLBACKEND": "pytorch", TIED_ENV: "1"}
    if cluster.socket_ifname:
        env |= {"GLOO_SOCKET_IFNAME": cluster.socket_ifname, "NCCL_SOCKET_IFNAME": cluster.socket_ifname}
    lines = [f"cd {q(str(REPO_ROOT))} || exit 96", "export " + " ".join(f"{k}={q(v)}" for k, v in env.items())]
    lines += [_FAILED, _ENDED]
    codes = []  # one exit-code file per process, written when it ends
    for role, count in (("server", cluster.servers), ("trainer", cluster.trainers)):
        for index in range(count):
            cfg = DistDGLConfig(
                **vars(training),
                servers=cluster.servers,
                trainers=cluster.trainers,
                torch_port=cluster.torch_port,
                ip_config=str(ip_config),
                part_config=str(part_config),
                machine=machine,
                index=index,
                out=str(out),
            )
            command = shlex.join([sys.executable, "-m", "training.distdgl", *process_args(role, cfg)])
            name = Path(logs) / f"machine{machine}-{role}{index}"
            log, code = q(f"{name}.log"), q(f"{name}.exit")
            lines += [f"rm -f {code}", f"( {command} > {log} 2>&1; echo $? > {code}.tmp && mv {code}.tmp {code} ) &"]
            codes.append(code)
    every = " ".join(codes)
    lines += [
        "while :; do",  # the first failure stops the machine's other processes; all ended with 0: done
        f"  if s=$(failed {every}); then trap '' TERM; kill -TERM 0; exit \"$s\"; fi",
        f"  ended {every} && exit 0",
        "  sleep 0.2",
        "done",
    ]
    return "\n".join(lines) + "\n"


# the machine script's helpers: the first non-zero exit code among the given files; all exist
_FAILED = (
    'failed() { for f in "$@"; do [ -f "$f" ] && s=$(cat "$f") && [ "$s" != 0 ] && { echo "$s"; return 0; }; '
    "done; return 1; }"
)
_ENDED = 'ended() { for f in "$@"; do [ -f "$f" ] || return 1; done; }'


def machine_command(cluster: DistDGLCluster, machine: int, script: str) -> list[str]:
    """The command that runs `script` on machine `machine` (``cluster.launcher``)."""
    if cluster.launcher == "ssh":
        # the remote login shell may be any shell: it only starts sh with the script
        return ["ssh", "-tt", "-o", "BatchMode=yes", cluster.addresses[machine], "exec sh -c " + shlex.quote(script)]
    return ["sh", "-c", script]


def run_machines(commands: Sequence[Sequence[str]], env: dict[str, str], poll_s: float = 0.2) -> list[int]:
    """Run every machine's command (tied to this process) until all end, or one fails and the
    others are stopped; their exit codes (negative: stopped by that signal)."""
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(tied_process(c, env=env, cwd=str(REPO_ROOT), grace_s=5.0)) for c in commands]
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes) or any(codes):
                break
            time.sleep(poll_s)
    return [p.returncode for p in procs]
