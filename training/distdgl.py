"""DistDGL training mode: DGL's distributed runtime serves the graph, our plain-torch layers train.

For graphs whose structure or features outgrow one machine: metis_partitions writes DGL's
distributed partition format (``distdgl/<graph_name>.json`` + ``part{p}/``, from our METIS
assignment; see ``graphs/partition.py``). Each machine p runs one or more DGL *servers*
holding part p's structure and features, and one or more *trainers*. A trainer joins the
servers (``dgl.distributed.initialize``), opens the ``DistGraph``, takes its seed nodes with
``node_split`` (disjoint across trainers, mostly local to its machine), samples neighbour
blocks through the servers (``DistNodeDataLoader`` + ``NeighborSampler``), pulls the input
rows of ``feat`` and the seeds' ``label`` from them, converts each DGL block to our CSC
:class:`training.blocks.Block` (:func:`block_from_dgl`) and trains the same
:class:`training.layers.GNN` as the shard path, wrapped in torch DDP (gloo on CPU, NCCL
on GPUs). Only this module imports DGL, lazily; the layers stay DGL-free.

Every process on every machine runs the same module with the same ``--ip-config``
(one line ``IP [PORT]`` per machine, machine m = line m) and ``--part-config``; the flags
become DGL's environment variables (:func:`dgl_env`), so no DGL launch script or ssh is
needed::

    # on machine M (0..N-1), NS servers and T trainers:
    python -m training.distdgl server  --machine M --server-index S --ip-config ip.txt \\
        --part-config distdgl/graph.json --servers NS --trainers T
    python -m training.distdgl trainer --machine M --trainer-index I --ip-config ip.txt \\
        --part-config distdgl/graph.json --servers NS --trainers T --out OUT [training flags]

The trainers' torch process group meets at the first machine's address (``--torch-port``);
set ``GLOO_SOCKET_IFNAME`` (``NCCL_SOCKET_IFNAME``) to the interface the machines reach each
other on, as for multi-node torchrun (``training/launch.py``). DGL chooses the local part by
comparing the machine's IP addresses with ip.txt and names its shared memory after the
graph, so two machines must not share a network namespace or ``/dev/shm``
(tests/test_distdgl.py gives each "machine" both, with ``ip netns`` and ``unshare -m``).

Outputs (``--out``): rank 0 writes ``model_final.safetensors`` (`training.outputs.MODEL_FINAL`:
a `training.state_file` of kind ``distdgl_model``, format ``DISTDGL_MODEL_FORMAT``, holding
{"state_dict", "model"}; read with :func:`load_distdgl_model`) and ``summary.json``; every trainer r writes
``trainer-{r}/seeds.npy`` (its node_split seeds, DGL's reshuffled ids), ``labels.npy`` (the
labels DistGraph served for them) and ``losses.json`` (mean loss per epoch, the share of its
seeds in its machine's part, the share of its sampled input rows served by other machines'
parts: remote feature traffic); ``summary.json`` has the latter over all trainers. Map the ids to
canonical ones with ``distdgl/orig_nids.npy``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch

from graphs.config_checks import (
    DEFAULT_FANOUTS,
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_RANKS,
    MAX_SEED,
    bounded_repr,
    check_fields,
    parse_fanouts,
)
from training.blocks import Block
from training.config import DEFAULT_LR
from training.layers import ModelConfig, build_model
from training.outputs import MODEL_FINAL, SUMMARY
from training.state_file import read_state_file, write_state_file

__all__ = [
    "DistDGLConfig",
    "block_from_dgl",
    "config_from_args",
    "dgl_env",
    "load_distdgl_model",
    "model_for_fanouts",
    "read_ip_config",
    "run_server",
    "run_trainer",
]

ROLES = ("server", "trainer")
DISTDGL_MODEL_FORMAT = 1  # the model file's format version (training.state_file, kind "distdgl_model")
_MODEL_KIND = "distdgl_model"


def load_distdgl_model(path: str | os.PathLike) -> dict:
    """{"state_dict", "model" (ModelConfig as a dict)} of a model file rank 0 wrote; StateFileError
    naming the file when it is not one (nothing in it is run)."""
    return read_state_file(
        path, kind=_MODEL_KIND, format_version=DISTDGL_MODEL_FORMAT, remedy="re-run the DistDGL training"
    )


@dataclass(kw_only=True)
class DistDGLConfig:
    """One DistDGL process: where it runs (machine, role) and, for trainers, what it trains."""

    ip_config: str = field(metadata={"help": "File with one 'IP [PORT]' line per machine (machine m = line m)."})
    part_config: str = field(metadata={"help": "metis_partitions' distdgl/<graph_name>.json."})
    machine: int = field(default=0, metadata={"max": MAX_RANKS, "help": "This machine's line in ip_config."})
    servers: int = field(default=1, metadata={"max": 1024, "help": "DGL servers per machine."})
    trainers: int = field(default=1, metadata={"max": 1024, "help": "Trainers per machine."})
    index: int = field(default=0, metadata={"max": 1024, "help": "This server's / trainer's index on its machine."})
    torch_port: int = field(
        default=29500, metadata={"max": 65535, "help": "Port of the trainers' torch process group (machine 0)."}
    )
    out: str = field(default="", metadata={"help": "Trainer output folder (rank 0 writes the model)."})
    fanouts: str = field(
        default=DEFAULT_FANOUTS,
        metadata={"help": "Neighbours sampled per layer, input layer first, comma separated (-1 = all)."},
    )
    batch_size: int = field(default=256, metadata={"max": MAX_BATCH, "help": "Seed nodes per trainer per step."})
    epochs: int = field(default=3, metadata={"max": MAX_EPOCHS, "help": "Passes over each trainer's seeds."})
    lr: float = field(default=DEFAULT_LR, metadata={"help": "Adam learning rate (training.optimizer.lr's default)."})
    seed: int = field(default=0, metadata={"max": MAX_SEED, "help": "Model initialisation and shuffling seed."})
    model: ModelConfig = field(default_factory=ModelConfig)

    def __post_init__(self) -> None:
        check_fields(self, "distdgl")
        for name in ("servers", "trainers", "batch_size", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"distdgl {name}={getattr(self, name)} must be at least 1")
        if self.machine < 0 or self.index < 0:
            raise ValueError(f"distdgl machine={self.machine} and index={self.index} must be >= 0")
        if not 0 < self.torch_port < 65536:
            raise ValueError(f"distdgl torch_port={self.torch_port} is not a TCP port")
        if not self.lr > 0:
            raise ValueError(f"distdgl lr={self.lr} must be positive")
        if not Path(self.part_config).is_file():
            raise FileNotFoundError(
                f"distdgl part_config {bounded_repr(self.part_config)} is not a file (run metis_partitions)"
            )

    @property
    def fanout_list(self) -> list[int]:
        return parse_fanouts(self.fanouts, "distdgl fanouts")


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


def block_from_dgl(block) -> Block:
    """A DGL message-flow block as our CSC :class:`Block` (destination nodes first among the
    sources, as DGL's `to_block` lays them out)."""
    indptr, indices, _eid = block.adj_tensors("csc")
    return Block(indptr.long(), indices.long(), block.num_src_nodes(), block.num_dst_nodes())


def model_for_fanouts(cfg: DistDGLConfig) -> ModelConfig:
    """The model config with one layer per sampled block (``model.num_layers`` 0: follow the fanouts)."""
    layers = len(cfg.fanout_list)
    if cfg.model.num_layers == 0:
        return replace(cfg.model, num_layers=layers)
    if cfg.model.num_layers != layers:
        raise ValueError(
            f"model.num_layers={cfg.model.num_layers} but fanouts={cfg.fanouts!r} samples {layers} blocks "
            "(one per layer); pass matching --fanouts or --model-num-layers 0"
        )
    return cfg.model


def run_server(cfg: DistDGLConfig) -> None:
    """Serve this machine's part until every trainer has finished (DGL exits the process)."""
    os.environ.update(dgl_env(cfg, "server"))
    import dgl

    dgl.distributed.initialize(cfg.ip_config)


def run_trainer(cfg: DistDGLConfig) -> dict:
    """Train on the DistGraph; returns the summary (also ``summary.json`` on rank 0)."""
    os.environ.update(dgl_env(cfg, "trainer"))
    import dgl
    import torch.distributed as dist

    ips = read_ip_config(cfg.ip_config)
    model_cfg = model_for_fanouts(cfg)
    graph_name = json.loads(Path(cfg.part_config).read_text())["graph_name"]
    t0 = time.perf_counter()
    dgl.distributed.initialize(cfg.ip_config)
    rank, world = cfg.machine * cfg.trainers + cfg.index, len(ips) * cfg.trainers
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{cfg.index % torch.cuda.device_count()}" if cuda else "cpu")
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://{ips[0]}:{cfg.torch_port}",
        rank=rank,
        world_size=world,
    )
    try:
        g = dgl.distributed.DistGraph(graph_name, part_config=cfg.part_config)
        seeds, labels, num_classes = _trainer_seeds(g, cfg)
        in_feats = int(g.ndata["feat"].shape[1])

        torch.manual_seed(cfg.seed)
        model = build_model(model_cfg, in_feats, num_classes).to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
        optim = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
        sampler = dgl.dataloading.NeighborSampler(cfg.fanout_list)
        dgl.seed(cfg.seed + rank)
        loader = dgl.dataloading.DistNodeDataLoader(
            g, seeds, sampler, batch_size=cfg.batch_size, shuffle=True, drop_last=False
        )
        book = g.get_partition_book()
        local_seed_share = float((book.nid2partid(seeds) == book.partid).float().mean()) if len(seeds) else 0.0
        losses, steps, inputs, remote = _train_epochs(cfg, g, loader, ddp, optim, device)

        out = Path(cfg.out)
        mine = out / f"trainer-{rank}"
        mine.mkdir(parents=True, exist_ok=True)
        np.save(mine / "seeds.npy", seeds.numpy().astype(np.int64))
        np.save(mine / "labels.npy", labels.numpy().astype(np.int64))
        trainer_facts = {"rank": rank, "part": int(book.partid), "steps": steps, "losses": losses}
        trainer_facts |= {"local_seed_share": local_seed_share, "remote_input_share": remote / max(inputs, 1)}
        (mine / "losses.json").write_text(json.dumps(trainer_facts))
        totals = torch.tensor([inputs, remote], dtype=torch.float64)
        dist.all_reduce(totals)
        summary = {
            "mode": "distdgl",
            "graph_name": graph_name,
            "machines": len(ips),
            "trainers": world,
            "servers_per_machine": cfg.servers,
            "seeds_per_trainer": len(seeds),
            "steps_per_trainer": steps,
            "epoch_loss_rank0": losses,
            "remote_input_share": float(totals[1] / max(float(totals[0]), 1.0)),
            "seconds": round(time.perf_counter() - t0, 3),
            "config": {k: v for k, v in asdict(cfg).items() if k != "model"} | {"model": asdict(model_cfg)},
        }
        if rank == 0:
            _write_rank0_outputs(out, model, model_cfg, summary)
        return summary
    finally:
        dist.destroy_process_group()


def _trainer_seeds(g, cfg: DistDGLConfig) -> tuple[torch.Tensor, torch.Tensor, int]:
    """This trainer's training seeds (as many as every other trainer's), their labels and the class count."""
    import dgl
    import torch.distributed as dist

    for name in ("feat", "label", "train_mask"):
        if name not in g.ndata:
            raise ValueError(f"{cfg.part_config}: the DistDGL graph has no node data {name!r}")
    seeds = dgl.distributed.node_split(g.ndata["train_mask"], g.get_partition_book(), force_even=True)
    # equal step counts on every trainer (DDP): all take the smallest split's length
    count = torch.tensor([len(seeds)])
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    seeds = seeds[: int(count)]
    labels = g.ndata["label"][seeds]
    # classes: 1 + the largest label any trainer's seeds carry
    num_classes = torch.tensor([int(labels.max()) + 1 if len(labels) else 0])
    dist.all_reduce(num_classes, op=dist.ReduceOp.MAX)
    num_classes = int(num_classes)
    if num_classes < 2:
        raise ValueError(f"{cfg.part_config}: the training nodes carry {num_classes} classes; need at least 2")
    return seeds, labels, num_classes


def _train_epochs(cfg: DistDGLConfig, g, loader, ddp, optim, device) -> tuple[list[float], int, int, int]:
    """Every epoch's optimizer steps; (mean loss per epoch, steps, input nodes, remote input nodes)."""
    import torch.nn.functional as F

    book = g.get_partition_book()
    local_part = book.partid
    losses, steps, inputs, remote = [], 0, 0, 0
    for _epoch in range(cfg.epochs):
        total, n = 0.0, 0
        for input_nodes, out_nodes, dgl_blocks in loader:
            blocks = [block_from_dgl(b).to(device) for b in dgl_blocks]
            inputs += len(input_nodes)
            remote += int((book.nid2partid(input_nodes) != local_part).sum())
            x = g.ndata["feat"][input_nodes].float().to(device)
            y = g.ndata["label"][out_nodes].long().to(device)
            ddp.train()
            loss = F.cross_entropy(ddp(blocks, x), y)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            total, n, steps = total + float(loss) * len(out_nodes), n + len(out_nodes), steps + 1
        losses.append(total / max(n, 1))
    return losses, steps, inputs, remote


def _write_rank0_outputs(out: Path, model: torch.nn.Module, model_cfg: ModelConfig, summary: dict) -> None:
    """Rank 0: the trained model file and summary.json."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    write_state_file(
        out / MODEL_FINAL,
        {"state_dict": state, "model": asdict(model_cfg)},
        kind=_MODEL_KIND,
        format_version=DISTDGL_MODEL_FORMAT,
    )
    (out / SUMMARY).write_text(json.dumps(summary, indent=2))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.distdgl", description=__doc__.split("\n")[0])
    p.add_argument("role", choices=ROLES)
    p.add_argument("--server-index", type=int, default=0, help="This server's index on its machine.")
    p.add_argument("--trainer-index", type=int, default=0, help="This trainer's index on its machine.")
    helps = {f.name: f.metadata.get("help", "") for f in fields(DistDGLConfig)}
    for f in fields(DistDGLConfig):
        if f.name in ("model", "index"):
            continue
        kind = {"int": int, "float": float}.get(str(f.type), str)
        p.add_argument(
            "--" + f.name.replace("_", "-"), type=kind, help=helps[f.name], required=f.name.endswith("config")
        )
    for f in fields(ModelConfig):
        if str(f.type) in ("int", "float", "str"):
            kind = {"int": int, "float": float}.get(str(f.type), str)
            p.add_argument("--model-" + f.name.replace("_", "-"), type=kind, help=f.metadata.get("help", ""))
    return p


def config_from_args(argv: list[str] | None = None) -> tuple[str, DistDGLConfig]:
    """(role, config) from the command line (flags left out keep the dataclass defaults)."""
    args = vars(_parser().parse_args(argv))
    role = args.pop("role")
    index = args.pop("server_index") if role == "server" else args.pop("trainer_index")
    args.pop("trainer_index", None), args.pop("server_index", None)
    model = {k[len("model_") :]: v for k, v in args.items() if k.startswith("model_") and v is not None}
    top = {k: v for k, v in args.items() if not k.startswith("model_") and v is not None}
    return role, DistDGLConfig(**top, index=index, model=ModelConfig(**model))


def main(argv: list[str] | None = None) -> None:
    role, cfg = config_from_args(argv)
    if role == "server":
        run_server(cfg)
    else:
        if not cfg.out:
            raise SystemExit("python -m training.distdgl trainer needs --out")
        run_trainer(cfg)


if __name__ == "__main__":
    main()
