"""A DDP rank for tests/test_comm_hooks.py (its own module, so the processes torch.multiprocessing
spawns import only torch and training)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from training.comm_hooks import CommConfig, setup_comm_hook
from training.compensation import GradientEMA


def comm_hook_worker(rank: int, store: str, out: str, runs: list, steps: int) -> None:
    """For each (name, hook, grad_ema, bucket_cap_mb, hidden, out) of ``runs``: `hook_run`; rank 0 saves
    {name: its record}."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    results = {name: hook_run(rank, hook, steps, *rest) for name, hook, *rest in runs}
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def hook_run(rank: int, hook: str, steps: int, grad_ema: float, bucket_cap_mb: float, hidden: int, out: int) -> dict:
    """``steps`` SGD steps of a small MLP under DDP with ``hook`` and byte counting: per step,
    the bytes counted, every rank's own gradient, the DDP gradient it received, the int8 scale
    each rank would send, and finally every rank's parameters."""
    torch.manual_seed(0)  # the same initial parameters on both ranks
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, out))
    local = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, out))
    # bucket_cap_mb 1: one bucket for all parameters (the int8 scale is one per rank and step)
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    cfg = CommConfig(hook=hook, count_bytes=True, powersgd_start_step=2, powersgd_rank=1, bucket_cap_mb=bucket_cap_mb)
    counter = setup_comm_hook(ddp, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if grad_ema:
        opt = GradientEMA(opt, grad_ema)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    record = {"bytes": [], "own": [], "ddp": [], "scale": []}
    for _ in range(steps):
        x, y = torch.randn(32, 64, generator=gen), torch.randint(0, 8, (32,), generator=gen)
        local.load_state_dict(model.state_dict())
        torch.nn.functional.cross_entropy(local(x), y).backward()
        own = torch.cat([p.grad.flatten() for p in local.parameters()])
        local.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        record["bytes"].append(counter.take())
        record["own"].append(own)
        record["ddp"].append(torch.cat([p.grad.flatten() for p in model.parameters()]).clone())
        record["scale"].append(own.abs().max() / 127)
        opt.step()
        opt.zero_grad()
    gathered = {}
    for key in ("own", "ddp", "scale"):
        mine = torch.stack(record[key])
        gathered[key] = [torch.zeros_like(mine) for _ in range(2)]
        dist.all_gather(gathered[key], mine)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered["params"] = [torch.zeros_like(params) for _ in range(2)]
    dist.all_gather(gathered["params"], params)
    gathered["bytes"] = record["bytes"]
    gathered["numel"] = sum(p.numel() for p in model.parameters())
    return gathered
