"""A DDP rank for tests/test_training.py, in its own small module so that the processes
torch.multiprocessing spawns import only torch and training (not Dagster or the tests)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from training.data import ShardStream, cross_entropy
from training.layers import ModelConfig, build_model


def ddp_gradient_worker(rank: int, shards: str, store: str, out: str) -> None:
    """One step on this rank's first minibatch: save (rank 0) every rank's DDP gradient and
    the gradient of its own minibatch alone."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    cfg = ModelConfig(conv="sage", hidden=16, num_layers=2, dropout=0.0)
    torch.manual_seed(0)
    model = build_model(cfg, 16, 4)
    local = build_model(cfg, 16, 4)
    local.load_state_dict(model.state_dict())
    ddp = DistributedDataParallel(model)
    mb = next(iter(ShardStream(shards, rank, 0, prefetch=0)))  # each rank its own minibatch
    cross_entropy(mb, ddp(mb.blocks, mb.x)).backward()
    cross_entropy(mb, local(mb.blocks, mb.x)).backward()  # this rank's gradient alone
    grads = {
        "ddp": torch.cat([p.grad.flatten() for p in model.parameters()]),
        "local": torch.cat([p.grad.flatten() for p in local.parameters()]),
    }
    gathered = {}
    for key, g in grads.items():
        gathered[key] = [torch.zeros_like(g) for _ in range(2)]
        dist.all_gather(gathered[key], g)
    if rank == 0:
        torch.save(gathered, out)
    dist.barrier()
    dist.destroy_process_group()
