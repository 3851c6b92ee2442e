"""DistDGL training mode: DGL's distributed runtime serves the graph, our plain-torch layers train.

For graphs whose structure or features outgrow one machine: metis_partitions writes DGL's
distributed partition format (``distdgl/<graph_name>.json`` + ``part{p}/``, from our METIS
assignment; see ``graphs/stages/partition.py``). Each machine p runs one or more DGL *servers*
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

The epochs run on the loop every task shares (`training.loop.run_epochs`, the
`DistDGLTraining` head). After every epoch each trainer evaluates its ``node_split`` share of ``val_mask`` and
``test_mask`` (when the partitions carry them; a logged note otherwise) over full
neighbourhoods, and the correct/total counts are summed over all trainers, so every rank has
the same val/test accuracy; rank 0 then writes ``checkpoint.safetensors``, from which a rerun
of the same config continues (`training.distdgl_epochs`: format, resume, refusal of another
run's checkpoint). ``--stop-after-epoch N`` (testing, maintenance) ends a run after epoch N.

Outputs (``--out``), rank 0: ``model_final.safetensors`` (`training.outputs.MODEL_FINAL`) and
``model_best.safetensors`` (MODEL_BEST: the epoch with the highest val_acc), each a
`training.state_file` of kind ``distdgl_model``, format ``DISTDGL_MODEL_FORMAT``, holding
{"state_dict", "model", "epoch"} (read with :func:`load_distdgl_model`); ``metrics.parquet``
(METRICS, `training.outputs.METRIC_COLUMNS`): one row per epoch over all trainers (rank null;
loss and minibatch_acc over every trainer's seeds, val_acc/test_acc, lr, steps per trainer,
seeds, seeds_per_s, epoch/train/eval seconds of rank 0); ``summary.json``: best_epoch,
best_val_acc, test_acc_at_best_val, final_val_acc, final_test_acc, the run's facts and
``history`` (the rows, plus each trainer's loss, input and remote input counts:
`training.distdgl_epochs.epoch_row`). Every trainer r writes ``trainer-{r}/seeds.npy`` (its
node_split seeds, DGL's reshuffled ids), ``labels.npy`` (the labels DistGraph served for them)
and ``losses.json`` (mean loss per epoch, the share of its seeds in its machine's part, the
share of its sampled input rows served by other machines' parts: remote feature traffic);
``summary.json`` has the latter over all trainers, and ``rx_bytes_per_step``: the bytes a
machine's interface (the first of ``GLOO_SOCKET_IFNAME``) received per training step, sampling,
feature rows and gradients together (None where that variable is unset). Map the ids to canonical ones with
``distdgl/orig_nids.npy``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from graphs.infra.processes import die_with_parent
from training.blocks import Block
from training.checkpoint import CHECKPOINT_NAME
from training.distdgl_config import DistDGLConfig, config_from_args, dgl_env, model_for_fanouts, read_ip_config
from training.distdgl_epochs import (
    epoch_row,
    epoch_seed,
    history_summary,
    interface_rx_bytes,
    resume_header,
    run_identity,
    save_checkpoint,
    share_optimizer_state,
    trainer_history,
)
from training.distributed import DistInfo
from training.layers import ModelConfig, build_model
from training.loop import TaskHead, run_epochs
from training.outputs import METRICS, MODEL_BEST, MODEL_FINAL, SUMMARY, write_metrics
from training.profiling import PROFILE_DIR, StepProfiler
from training.state_file import read_state_file, write_state_file

__all__ = ["STAGE", "TIED_ENV", "block_from_dgl", "load_distdgl_model", "run_server", "run_trainer"]

STAGE = "distdgl_model"  # the asset that runs this module on every machine (assets.distdgl_model)
TIED_ENV = "GNNFLOW_DISTDGL_TIED"  # set: the process dies with its parent (training.distdgl_cluster)
EVAL_SPLITS = ("val", "test")  # evaluated after every epoch when the partitions carry their masks
DISTDGL_MODEL_FORMAT = 1  # the model file's format version (training.state_file, kind "distdgl_model")
_MODEL_KIND = STAGE  # the kind of its model files (training.state_file)

log = logging.getLogger("training.distdgl")


def load_distdgl_model(path: str | os.PathLike) -> dict:
    """{"state_dict", "model" (ModelConfig as a dict)} of a model file rank 0 wrote; StateFileError
    naming the file when it is not one (nothing in it is run)."""
    return read_state_file(
        path, kind=_MODEL_KIND, format_version=DISTDGL_MODEL_FORMAT, remedy="re-run the DistDGL training"
    )


def block_from_dgl(block) -> Block:
    """A DGL message-flow block as our CSC :class:`Block` (destination nodes first among the
    sources, as DGL's `to_block` lays them out)."""
    indptr, indices, _eid = block.adj_tensors("csc")
    return Block(indptr.long(), indices.long(), block.num_src_nodes(), block.num_dst_nodes())


def run_server(cfg: DistDGLConfig) -> None:
    """Serve this machine's part until every trainer has finished (DGL exits the process)."""
    os.environ.update(dgl_env(cfg, "server"))
    import dgl

    dgl.distributed.initialize(cfg.ip_config)


@dataclass(eq=False)
class _Trainer:
    """One trainer's run: the graph, its seeds, the model and optimizer, and what the shared
    epoch loop (`training.loop.run_epochs`) reads and advances: the epochs, the rows so far
    (``history``, one per epoch over all trainers) and the best epoch."""

    cfg: DistDGLConfig
    info: DistInfo
    model_cfg: ModelConfig
    g: object
    rank: int
    world: int
    device: torch.device
    seeds: torch.Tensor
    labels: torch.Tensor
    local_seed_share: float
    model: torch.nn.Module
    ddp: torch.nn.parallel.DistributedDataParallel
    optim: torch.optim.Optimizer
    eval_loaders: dict  # split -> this trainer's DistNodeDataLoader over its share (None: no share)
    epochs: int
    start_epoch: int  # the checkpoint's epoch (0: none)
    history: list[dict]
    best: dict | None  # {epoch, val_acc, test_acc} of the best validated epoch
    profiler: StepProfiler | None = None  # rank 0 with profiler 'torch': the first steps' trace
    best_state: dict | None = None  # rank 0: the best epoch's model state
    # the latest collectives' tensors, kept until the process group is gone: a gloo worker dropping the
    # last reference to a Python tensor needs the GIL, which the group's teardown holds (a deadlock)
    comm_tensors: list = field(default_factory=list)
    stopped_early: bool = False  # no early stopping: every epoch is trained


def run_trainer(cfg: DistDGLConfig) -> dict:
    """Train on the DistGraph, evaluating and checkpointing after every epoch; returns the
    summary (also ``summary.json`` on rank 0)."""
    os.environ.update(dgl_env(cfg, "trainer"))
    import dgl

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
        t = _open_trainer(cfg, model_cfg, g, rank, world, device, len(ips))
        try:
            run_epochs(t, DistDGLTraining(), log.info, progress=False, on_epoch_end=_stop_after(cfg.stop_after_epoch))
        except _Stopped:
            if rank == 0:
                log.info("stopped after epoch %d (--stop-after-epoch); a rerun continues", cfg.stop_after_epoch)
            return {"mode": "distdgl", "stopped_after_epoch": cfg.stop_after_epoch}
        if t.profiler is not None:
            t.profiler.close()  # fewer steps than its schedule: no trace
        summary = _summary(t, graph_name, len(ips), time.perf_counter() - t0)
        _write_trainer_outputs(t, summary)
        return summary
    finally:
        dist.destroy_process_group()


def _open_trainer(cfg: DistDGLConfig, model_cfg: ModelConfig, g, rank: int, world: int, device, machines: int):
    """The trainer's seeds, evaluation loaders, model, DDP and optimizer, continued from the
    checkpoint in ``--out`` when there is one (module docstring of `training.distdgl_epochs`)."""
    seeds, labels, num_classes = _trainer_seeds(g, cfg)
    book = g.get_partition_book()
    local_seed_share = float((book.nid2partid(seeds) == book.partid).float().mean()) if len(seeds) else 0.0
    identity = run_identity(_config_dict(cfg, model_cfg), machines)
    saved, header = resume_header(Path(cfg.out) / CHECKPOINT_NAME, identity, rank, device)

    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg, int(g.ndata["feat"].shape[1]), num_classes).to(device)
    if saved is not None:
        model.load_state_dict(saved["model"])  # DDP's construction broadcasts rank 0's parameters
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optim = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)
    if header["epoch"]:
        share_optimizer_state(optim, header["optimizer"], saved["optimizer"] if saved else None, device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    t = _Trainer(
        cfg=cfg,
        info=DistInfo(rank=rank, world_size=world, local_rank=cfg.index, device=device, backend=backend),
        model_cfg=model_cfg,
        g=g,
        rank=rank,
        world=world,
        device=device,
        seeds=seeds,
        labels=labels,
        local_seed_share=local_seed_share,
        model=model,
        ddp=ddp,
        optim=optim,
        eval_loaders=_eval_loaders(g, cfg, model_cfg.num_layers, rank),
        epochs=cfg.epochs,
        start_epoch=header["epoch"],
        history=header["rows"],
        best=header["best"],
    )
    if saved is not None and saved["best"] is not None:
        t.best_state = saved["best"]["model"]
    if rank == 0 and cfg.profiler == "torch" and t.start_epoch == 0:  # the run's first steps only
        t.profiler = StepProfiler(True, Path(cfg.out) / PROFILE_DIR, device)
    if rank == 0 and header["epoch"]:
        log.info("continuing after epoch %d from %s", header["epoch"], Path(cfg.out) / CHECKPOINT_NAME)
    return t


def _config_dict(cfg: DistDGLConfig, model_cfg: ModelConfig) -> dict:
    """The config as trained (model.num_layers resolved), as summary.json and the checkpoint hold it."""
    return {k: v for k, v in asdict(cfg).items() if k != "model"} | {"model": asdict(model_cfg)}


def _eval_loaders(g, cfg: DistDGLConfig, layers: int, rank: int) -> dict:
    """split -> a full-neighbourhood DistNodeDataLoader over this trainer's `node_split` share of
    the split's mask (None when the share is empty); splits without a mask are left out."""
    import dgl

    sampler = dgl.dataloading.NeighborSampler([-1] * layers)
    loaders = {}
    for split in EVAL_SPLITS:
        if f"{split}_mask" not in g.ndata:
            if rank == 0:
                log.warning("%s: no node data %s_mask: %s accuracy not evaluated", cfg.part_config, split, split)
            continue
        ids = dgl.distributed.node_split(g.ndata[f"{split}_mask"], g.get_partition_book(), force_even=True)
        loaders[split] = None
        if len(ids):
            loaders[split] = dgl.dataloading.DistNodeDataLoader(
                g, ids, sampler, batch_size=cfg.batch_size, shuffle=False, drop_last=False
            )
    return loaders


def _trainer_seeds(g, cfg: DistDGLConfig) -> tuple[torch.Tensor, torch.Tensor, int]:
    """This trainer's training seeds (as many as every other trainer's), their labels and the class count."""
    import dgl

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


class _Stopped(Exception):
    """``--stop-after-epoch`` reached (after that epoch's checkpoint)."""


def _stop_after(epoch: int):
    """The loop's epoch hook that ends the run after epoch `epoch` (from 1; 0 = never)."""

    def hook(done: int, rows: list) -> None:
        if epoch and done + 1 == epoch:
            raise _Stopped

    return hook


class DistDGLTraining(TaskHead):
    """The DistDGL trainers' head of `training.loop.run_epochs`: every trainer trains its seeds
    and takes part in the evaluation, whose counts are summed over the trainers, so every rank
    holds the same row and best epoch; rank 0 checkpoints (`training.distdgl_epochs`). The loop
    exchanges nothing more (``rows_agree``): every collective's tensor stays referenced until the
    process group is gone (``_Trainer.comm_tensors``), which the loop's own exchanges could not promise."""

    rows_agree = True

    def train_epoch(self, t: _Trainer, epoch: int) -> dict:
        """Epoch `epoch` (from 0; seeded from (seed, rank, epoch + 1)), evaluated; the row over
        all trainers, the same on every rank."""
        import dgl

        start, t.comm_tensors = time.perf_counter(), []
        seed = epoch_seed(t.cfg.seed, t.rank, epoch + 1)
        torch.manual_seed(seed)  # dropout
        dgl.seed(seed)  # DGL's neighbour sampling in this process
        counts = _train_epoch(t, seed)
        train_seconds = time.perf_counter() - start
        accs = _evaluate(t)
        seconds = {"train_seconds": train_seconds, "eval_seconds": time.perf_counter() - start - train_seconds}
        row = _epoch_row(t, epoch + 1, counts, accs, seconds | {"epoch_seconds": time.perf_counter() - start})
        val = row["val_acc"]
        if val is not None and not math.isnan(val) and (t.best is None or val > t.best["val_acc"]):
            t.best = {"epoch": epoch + 1, "val_acc": val, "test_acc": row["test_acc"]}
            if t.rank == 0:
                t.best_state = _cpu_state(t.model)
        if t.profiler is not None and t.profiler.done:
            t.profiler = None
        if t.rank == 0:
            log.info(
                "epoch %d/%d: loss %.4f, val %s, test %s, %.2f s",
                *(epoch + 1, t.cfg.epochs, row["loss"], row["val_acc"], row["test_acc"], row["epoch_seconds"]),
            )
        return row

    def evaluate(self, t: _Trainer, epoch: int, row: dict) -> bool:
        return False  # evaluated with every trainer in train_epoch; no early stopping

    def checkpoint(self, t: _Trainer, epoch: int) -> None:
        save_checkpoint(
            Path(t.cfg.out) / CHECKPOINT_NAME,
            {
                "epoch": epoch + 1,
                "model": _cpu_state(t.model),
                "optimizer": t.optim.state_dict(),
                "rows": t.history,
                "best": None if t.best is None else t.best | {"model": t.best_state},
                "config": run_identity(_config_dict(t.cfg, t.model_cfg), t.world // t.cfg.trainers),
            },
        )


def _train_epoch(t: _Trainer, seed: int) -> torch.Tensor:
    """One pass over the trainer's seeds in an order drawn from `seed`; float64 counts
    [loss x seeds, seeds, correct, steps, input nodes, input nodes of other machines' parts,
    bytes its machine's interface received meanwhile (-1: unknown)]."""
    import dgl

    order = torch.randperm(len(t.seeds), generator=torch.Generator().manual_seed(seed))
    sampler = dgl.dataloading.NeighborSampler(t.cfg.fanout_list)
    loader = dgl.dataloading.DistNodeDataLoader(
        t.g, t.seeds[order], sampler, batch_size=t.cfg.batch_size, shuffle=False, drop_last=False
    )
    book = t.g.get_partition_book()
    total, n, correct, steps, inputs, remote = 0.0, 0, 0, 0, 0, 0
    rx_before = interface_rx_bytes()
    t.ddp.train()
    for input_nodes, out_nodes, dgl_blocks in loader:
        blocks = [block_from_dgl(b).to(t.device) for b in dgl_blocks]
        inputs += len(input_nodes)
        remote += int((book.nid2partid(input_nodes) != book.partid).sum())
        x = t.g.ndata["feat"][input_nodes].float().to(t.device)
        y = t.g.ndata["label"][out_nodes].long().to(t.device)
        logits = t.ddp(blocks, x)
        loss = F.cross_entropy(logits, y)
        t.optim.zero_grad(set_to_none=True)
        loss.backward()
        t.optim.step()
        if t.profiler is not None:
            t.profiler.step()
        total, n, steps = total + float(loss) * len(out_nodes), n + len(out_nodes), steps + 1
        correct += int((logits.argmax(1) == y).sum())
    rx_after = interface_rx_bytes()
    rx = rx_after - rx_before if min(rx_before, rx_after) >= 0 else -1
    return torch.tensor([total, n, correct, steps, inputs, remote, rx], dtype=torch.float64)


def _evaluate(t: _Trainer) -> dict[str, float]:
    """``{split}_acc`` over every trainer's share of each split (the same on every rank; NaN for
    an empty split): the model in eval mode over full neighbourhoods, counts all-reduced."""
    if not t.eval_loaders:
        return {}
    counts = torch.zeros(2 * len(t.eval_loaders), dtype=torch.int64)
    t.model.eval()
    with torch.no_grad():
        for i, loader in enumerate(t.eval_loaders.values()):
            for input_nodes, out_nodes, dgl_blocks in loader or ():
                blocks = [block_from_dgl(b).to(t.device) for b in dgl_blocks]
                x = t.g.ndata["feat"][input_nodes].float().to(t.device)
                pred = t.model(blocks, x).argmax(1).cpu()
                counts[2 * i] += int((pred == t.g.ndata["label"][out_nodes].long()).sum())
                counts[2 * i + 1] += len(out_nodes)
    counts = counts.to(t.device)
    dist.all_reduce(counts)
    t.comm_tensors.append(counts)
    counts = counts.cpu().tolist()
    return {
        f"{split}_acc": counts[2 * i] / counts[2 * i + 1] if counts[2 * i + 1] else math.nan
        for i, split in enumerate(t.eval_loaders)
    }


def _epoch_row(t: _Trainer, epoch: int, counts: torch.Tensor, accs: dict, seconds: dict) -> dict:
    """The epoch's row from every trainer's counts (gathered) and rank 0's accuracies and times."""
    gathered, mine = [torch.zeros_like(counts, device=t.device) for _ in range(t.world)], counts.to(t.device)
    dist.all_gather(gathered, mine)
    t.comm_tensors += [mine, *gathered]
    return epoch_row(epoch, torch.stack(gathered).cpu(), accs, seconds, t.cfg.lr)


def _summary(t: _Trainer, graph_name: str, machines: int, seconds: float) -> dict:
    """summary.json: the run's facts, best and final accuracies, and the per-epoch rows."""
    return {
        "mode": "distdgl",
        "graph_name": graph_name,
        "machines": machines,
        "trainers": t.world,
        "servers_per_machine": t.cfg.servers,
        "seeds_per_trainer": len(t.seeds),
        **history_summary(t.history, t.best),
        "resumed_after_epoch": t.start_epoch,
        "seconds": round(seconds, 3),
        "config": _config_dict(t.cfg, t.model_cfg),
        "history": t.history,
    }


def _write_trainer_outputs(t: _Trainer, summary: dict) -> None:
    """Every trainer: ``trainer-{rank}/``; rank 0 also the model files, metrics and summary."""
    out = Path(t.cfg.out)
    mine = out / f"trainer-{t.rank}"
    mine.mkdir(parents=True, exist_ok=True)
    np.save(mine / "seeds.npy", t.seeds.numpy().astype(np.int64))
    np.save(mine / "labels.npy", t.labels.numpy().astype(np.int64))
    facts = {"rank": t.rank, "part": int(t.g.get_partition_book().partid), "local_seed_share": t.local_seed_share}
    (mine / "losses.json").write_text(json.dumps(facts | trainer_history(t.history, t.rank)))
    if t.rank != 0:
        return
    model = asdict(t.model_cfg)
    final = {"state_dict": _cpu_state(t.model), "model": model, "epoch": summary["final_epoch"]}
    write_state_file(out / MODEL_FINAL, final, kind=_MODEL_KIND, format_version=DISTDGL_MODEL_FORMAT)
    if t.best_state is not None:
        best = {"state_dict": t.best_state, "model": model, "epoch": t.best["epoch"]}
        write_state_file(out / MODEL_BEST, best, kind=_MODEL_KIND, format_version=DISTDGL_MODEL_FORMAT)
    write_metrics(t.history, out / METRICS)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2))


def _cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    role, cfg = config_from_args(argv, description=__doc__.split("\n")[0])
    if os.environ.get(TIED_ENV) and not die_with_parent():  # started by distdgl_model's machine script
        raise SystemExit(f"{role}: the machine script that started it is gone")
    if role == "server":
        run_server(cfg)
    else:
        if not cfg.out:
            raise SystemExit("python -m training.distdgl trainer needs --out")
        try:
            run_trainer(cfg)
        except BaseException:
            # DGL's exit handlers wait for the other clients, which wait for this one: a failed
            # trainer would hang instead of ending, so it ends here, its error logged
            log.exception("trainer %d of machine %d failed", cfg.index, cfg.machine)
            logging.shutdown()
            os._exit(1)


if __name__ == "__main__":
    main()
