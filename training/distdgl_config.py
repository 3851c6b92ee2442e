"""DistDGL settings: what a run trains, how many processes serve and train on each machine,
and one process's place (machine, index, files); the command-line flags of
``python -m training.distdgl`` both ways.

Each setting is declared once: `DistDGLSampling` (the ``distdgl`` block of the
``distdgl_model`` asset: fanouts, batch size, stop_after_epoch), `DistDGLTraining` (what one
run trains: its sampling plus the epochs, learning rate, seed, profiler and model the asset
takes from its ``training`` and ``model`` blocks; the training flags), `DistDGLProcesses`
(servers and trainers per machine, the trainers' torch port) and `DistDGLConfig`, one
process: both of those plus the ip_config, the partition config, the machine, the index and
the output folder. `training.distdgl_cluster.DistDGLCluster` extends `DistDGLProcesses` with
the machines' addresses and how they are started. This module imports neither DGL nor torch's
distributed package.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import ClassVar

from graphs.infra.config_checks import (
    DEFAULT_FANOUTS,
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_RANKS,
    MAX_RATE,
    MAX_SEED,
    bounded_repr,
    check_fields,
    parse_fanouts,
)
from training.config import DEFAULT_LR
from training.layers import ModelConfig

__all__ = [
    "ROLES",
    "DistDGLConfig",
    "DistDGLProcesses",
    "DistDGLSampling",
    "DistDGLTraining",
    "config_from_args",
    "dgl_env",
    "model_for_fanouts",
    "process_args",
    "read_ip_config",
]

ROLES = ("server", "trainer")
DISTDGL_PROFILERS = ("torch", "none")  # training.profiler's choices but nsys
MAX_PROCESSES = 1024  # servers or trainers per machine


@dataclass(kw_only=True)
class DistDGLSampling:
    """How DistDGL's trainers sample (online, from the DistGraph), and when a run stops early for
    maintenance; what is trained is the asset's ``model`` and ``training`` blocks."""

    PREFIX: ClassVar[str] = "distdgl"

    fanouts: str = field(
        default=DEFAULT_FANOUTS,
        metadata={"help": "Neighbours sampled per layer, input layer first, comma separated (-1 = all)."},
    )
    batch_size: int = field(default=256, metadata={"max": MAX_BATCH, "help": "Seed nodes per trainer per step."})
    stop_after_epoch: int = field(
        default=0,
        metadata={
            "max": MAX_EPOCHS,
            "help": "Testing/maintenance: end the run once it completes this epoch (checkpoint written, no final "
            "outputs); a rerun continues from the checkpoint to the last epoch. 0: never.",
        },
    )

    def __post_init__(self) -> None:
        check_fields(self, self.PREFIX)
        self.check_sampling()

    def check_sampling(self) -> None:
        if self.stop_after_epoch < 0:
            raise ValueError(f"{self.PREFIX}.stop_after_epoch={self.stop_after_epoch} must be >= 0 (0: never)")
        if self.batch_size < 1:
            raise ValueError(f"{self.PREFIX}.batch_size={self.batch_size} must be at least 1")
        self.fanout_list  # noqa: B018 -- parsed here so a bad value fails before any process starts

    @property
    def fanout_list(self) -> list[int]:
        return parse_fanouts(self.fanouts, f"{self.PREFIX}.fanouts")


@dataclass(kw_only=True)
class DistDGLTraining(DistDGLSampling):
    """What one DistDGL run trains: its sampling, and the settings it reads of the asset's
    ``training`` block (epochs, optimizer.lr, seed, profiler) and ``model`` block."""

    PREFIX: ClassVar[str] = "training"

    epochs: int = field(default=3, metadata={"max": MAX_EPOCHS, "help": "Passes over each trainer's seeds."})
    lr: float = field(default=DEFAULT_LR, metadata={"max": MAX_RATE, "help": "Adam learning rate."})
    seed: int = field(default=0, metadata={"max": MAX_SEED, "help": "Model initialisation and shuffling seed."})
    profiler: str = field(
        default="torch",
        metadata={
            "help": f"one of {DISTDGL_PROFILERS}: torch = rank 0 records a torch.profiler trace of the run's steps "
            "3-5 into profile/ (as training.profiler does); none = no trace."
        },
    )
    model: ModelConfig = field(default_factory=ModelConfig)

    def __post_init__(self) -> None:
        check_fields(self, self.PREFIX)
        self.check_training()

    def check_training(self) -> None:
        self.check_sampling()
        if self.epochs < 1:
            raise ValueError(f"{self.PREFIX}.epochs={self.epochs} must be at least 1")
        if not self.lr > 0:
            raise ValueError(f"{self.PREFIX}.optimizer.lr={self.lr} must be positive")
        if self.profiler not in DISTDGL_PROFILERS:
            raise ValueError(f"{self.PREFIX}.profiler={bounded_repr(self.profiler)} is not one of {DISTDGL_PROFILERS}")


@dataclass(kw_only=True)
class DistDGLProcesses:
    """The processes of each machine, and where the trainers' torch process group meets."""

    PREFIX: ClassVar[str] = "cluster"

    servers: int = field(default=1, metadata={"max": MAX_PROCESSES, "help": "DGL servers per machine."})
    trainers: int = field(default=1, metadata={"max": MAX_PROCESSES, "help": "Trainers per machine."})
    torch_port: int = field(
        default=29500, metadata={"max": 65535, "help": "Port of the trainers' torch process group (machine 0)."}
    )

    def __post_init__(self) -> None:
        check_fields(self, self.PREFIX)
        self.check_processes()

    def check_processes(self) -> None:
        for name in ("servers", "trainers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{self.PREFIX}.{name}={getattr(self, name)} must be at least 1")
        if not 0 < self.torch_port < 65536:
            raise ValueError(f"{self.PREFIX}.torch_port={self.torch_port} is not a TCP port")


@dataclass(kw_only=True)
class DistDGLConfig(DistDGLTraining, DistDGLProcesses):
    """One DistDGL process: where it runs (machine, role) and, for trainers, what it trains."""

    PREFIX: ClassVar[str] = "distdgl"

    ip_config: str = field(metadata={"help": "File with one 'IP [PORT]' line per machine (machine m = line m)."})
    part_config: str = field(metadata={"help": "metis_partitions' distdgl/<graph_name>.json."})
    machine: int = field(default=0, metadata={"max": MAX_RANKS, "help": "This machine's line in ip_config."})
    index: int = field(
        default=0, metadata={"max": MAX_PROCESSES, "help": "This server's / trainer's index on its machine."}
    )
    out: str = field(default="", metadata={"help": "Trainer output folder (rank 0 writes the model)."})

    def __post_init__(self) -> None:
        check_fields(self, self.PREFIX)
        self.check_training()
        self.check_processes()
        if self.machine < 0 or self.index < 0:
            raise ValueError(f"distdgl.machine={self.machine} and distdgl.index={self.index} must be >= 0")
        if not Path(self.part_config).is_file():
            raise FileNotFoundError(
                f"distdgl part_config {bounded_repr(self.part_config)} is not a file (run metis_partitions)"
            )

    @property
    def training(self) -> DistDGLTraining:
        return DistDGLTraining(**{f.name: getattr(self, f.name) for f in fields(DistDGLTraining)})


def read_ip_config(path: str | os.PathLike) -> list[str]:
    """The machines' IP addresses, one per non-empty line of DGL's ip_config ('IP [PORT]')."""
    ips = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            ipaddress.ip_address(parts[0])
            if len(parts) > 2 or (len(parts) == 2 and not 0 < int(parts[1]) < 65536):
                raise ValueError
        except ValueError:
            raise ValueError(f"{path} line {n}: {line!r} is not 'IP [PORT]'") from None
        ips.append(parts[0])
    if not ips:
        raise ValueError(f"{path} lists no machines")
    return ips


def dgl_env(cfg: DistDGLConfig, role: str) -> dict[str, str]:
    """The environment variables DGL's `initialize` reads for this process (what DGL's
    launch script would export)."""
    if role not in ROLES:
        raise ValueError(f"role={role!r} is not one of {ROLES}")
    machines = len(read_ip_config(cfg.ip_config))
    if cfg.machine >= machines:
        raise ValueError(f"machine={cfg.machine} but {cfg.ip_config} lists {machines} machines")
    per_machine = cfg.servers if role == "server" else cfg.trainers
    if cfg.index >= per_machine:
        raise ValueError(f"{role} index={cfg.index} but {per_machine} {role}s per machine")
    env = {
        "DGL_DIST_MODE": "distributed",
        "DGL_ROLE": "server" if role == "server" else "client",
        "DGL_NUM_SERVER": str(cfg.servers),
        "DGL_NUM_CLIENT": str(cfg.trainers * machines),  # no sampler processes: samples in the trainer
        "DGL_NUM_SAMPLER": "0",
        "DGL_IP_CONFIG": str(cfg.ip_config),
        "DGL_CONF_PATH": str(cfg.part_config),
        "DGL_GRAPH_FORMAT": "csc",
    }
    if role == "server":
        env["DGL_SERVER_ID"] = str(cfg.machine * cfg.servers + cfg.index)
    return env


def model_for_fanouts(cfg: DistDGLTraining) -> ModelConfig:
    """The model config with one layer per sampled block (``model.num_layers`` 0: follow the fanouts)."""
    layers = len(cfg.fanout_list)
    if cfg.model.num_layers == 0:
        return replace(cfg.model, num_layers=layers)
    if cfg.model.num_layers != layers:
        raise ValueError(
            f"model.num_layers={cfg.model.num_layers} but fanouts={cfg.fanouts!r} samples {layers} blocks "
            "(one per layer): make fanouts and model.num_layers match, or set model.num_layers to 0"
        )
    return cfg.model


# ------------------------------------------------------------------ command-line flags, both ways
def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected true or false")
    return text.lower() == "true"


def _optional_str(text: str) -> str | None:
    return text or None  # '' = unset


_SCALARS = {"int": int, "float": float, "str": str, "bool": _bool, "str | None": _optional_str}


def _flag_value(value: object) -> str:
    """A value as its flag spells it (the inverse of `_SCALARS`' parsers)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _flag_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of `cls` that are flags: scalars, without the index (a role's own flag)."""
    return [f for f in fields(cls) if str(f.type) in _SCALARS and f.name != "index"]


def _parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.distdgl", description=description)
    p.add_argument("role", choices=ROLES)
    p.add_argument("--server-index", type=int, default=0, help="This server's index on its machine.")
    p.add_argument("--trainer-index", type=int, default=0, help="This trainer's index on its machine.")
    for f in _flag_fields(DistDGLConfig):
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            type=_SCALARS[str(f.type)],
            help=f.metadata.get("help", ""),
            required=f.name.endswith("config"),
        )
    for f in _flag_fields(ModelConfig):
        p.add_argument(
            "--model-" + f.name.replace("_", "-"), type=_SCALARS[str(f.type)], help=f.metadata.get("help", "")
        )
    return p


def config_from_args(argv: list[str] | None = None, description: str = "") -> tuple[str, DistDGLConfig]:
    """(role, config) from the command line (flags left out keep the dataclass defaults)."""
    args = vars(_parser(description).parse_args(argv))
    role = args.pop("role")
    index = args.pop("server_index") if role == "server" else args.pop("trainer_index")
    args.pop("trainer_index", None), args.pop("server_index", None)
    # a flag left out is None here, as is an empty --model-hidden-norm (whose default is None)
    model = {k[len("model_") :]: v for k, v in args.items() if k.startswith("model_") and v is not None}
    top = {k: v for k, v in args.items() if not k.startswith("model_") and v is not None}
    return role, DistDGLConfig(**top, index=index, model=ModelConfig(**model))


def process_args(role: str, cfg: DistDGLConfig) -> list[str]:
    """The arguments of ``python -m training.distdgl`` that `config_from_args` reads back as
    (role, cfg): every flag spelled out, so no default of the reading side is assumed."""
    if role not in ROLES:
        raise ValueError(f"role={role!r} is not one of {ROLES}")
    args = [role, f"--{role}-index", str(cfg.index)]
    for f in _flag_fields(DistDGLConfig):
        args.append(f"--{f.name.replace('_', '-')}={_flag_value(getattr(cfg, f.name))}")
    for f in _flag_fields(ModelConfig):
        args.append(f"--model-{f.name.replace('_', '-')}={_flag_value(getattr(cfg.model, f.name))}")
    return args
