"""DDP communication hooks (training.comm_hooks): each registers, trains, and sends the bytes it should.

Two gloo ranks (torch.multiprocessing) train a small MLP; the counting group measures what
each hook hands to its collectives, and every rank's own gradient is gathered so the
reduced gradient can be checked against the true mean.
"""

import pytest
import torch
import torch.multiprocessing as mp

from tests.comm_worker import comm_hook_worker
from training.comm_hooks import CommConfig, CommCounter, int8_quantize
from training.config import RunConfig

STEPS = 4


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every hook's record (and grad_ema=0.8 under plain DDP as "ema"), from one pair of ranks."""
    tmp = tmp_path_factory.mktemp("comm")
    runs = [(hook, hook, 0.0, 1.0, 48, 8) for hook in ("none", "fp16", "bf16", "powersgd", "int8")]
    # 64 x 8192 and 8192 x 64 weights (2 MB each): DDP's first bucket (<= 1 MB, last layer first)
    # closes after the second one, so there are two buckets
    runs += [("ema", "none", 0.8, 1.0, 48, 8), ("powersgd-buckets", "powersgd", 0.0, 0.5, 8192, 64)]
    mp.spawn(comm_hook_worker, args=(str(tmp / "store"), str(tmp / "out.pt"), runs, STEPS), nprocs=2)
    return torch.load(tmp / "out.pt", weights_only=True)


def true_mean(r: dict, step: int) -> torch.Tensor:
    return (r["own"][0][step] + r["own"][1][step]) / 2


def test_baseline_counts_fp32_allreduce_and_is_exact(results):
    r = results["none"]
    for step in range(STEPS):
        # W = 2: a ring all-reduce sends 2(W-1)/W = 1x the payload; 4 bytes per parameter
        assert r["bytes"][step]["sent"] == 4 * r["numel"]
        torch.testing.assert_close(r["ddp"][0][step], true_mean(r, step), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("hook,ratio,tol", [("fp16", 0.5, 2e-3), ("bf16", 0.5, 2e-2)])
def test_16_bit_hooks_halve_the_bytes(results, hook, ratio, tol):
    r, base = results[hook], results["none"]
    for step in range(STEPS):
        assert r["bytes"][step]["sent"] == ratio * base["bytes"][step]["sent"]
        mean = true_mean(r, step)
        err = (r["ddp"][0][step] - mean).abs().max()
        assert err <= tol * mean.abs().max()
    # every rank applies the same reduced gradient: identical replicas
    torch.testing.assert_close(r["params"][0], r["params"][1], rtol=0, atol=0)


def test_int8_hook_sends_a_quarter_and_stays_within_its_quantization_bound(results):
    r, base = results["int8"], results["none"]
    for step in range(STEPS):
        # one bucket: N int8 codes + one 4-byte scale; an all-gather with W = 2 sends it once
        assert r["bytes"][step]["sent"] == r["numel"] + 4
        assert r["bytes"][step]["sent"] < 0.26 * base["bytes"][step]["sent"]
        mean = true_mean(r, step)
        bound = (r["scale"][0][step] + r["scale"][1][step]) / (2 * 2)  # sum_r s_r / (2W)
        err = (r["ddp"][0][step] - mean).abs()
        assert float(err.max()) <= float(bound) * (1 + 1e-5) + 1e-8
        assert float(err.max()) > 0  # it did quantize
        torch.testing.assert_close(r["ddp"][0][step], r["ddp"][1][step], rtol=0, atol=0)
    torch.testing.assert_close(r["params"][0], r["params"][1], rtol=0, atol=0)


def test_powersgd_compresses_after_its_start_step(results):
    r, base = results["powersgd"], results["none"]
    # torch's PowerSGD all-reduces plainly for the first start_powerSGD_iter (2) steps
    assert r["bytes"][0]["sent"] == base["bytes"][0]["sent"]
    n_in, hidden, n_out = 64, 48, 8
    # then each weight matrix (n x m) goes as P (n x 1) and Q (m x 1): both gain more than torch's
    # min_compression_rate 2 (48*64 vs 112 floats, 8*48 vs 56); the bias vectors go uncompressed
    compressed = (hidden + n_in) + (n_out + hidden)
    vectors = hidden + n_out
    for step in range(2, STEPS):
        assert r["bytes"][step]["sent"] == 4 * (compressed + vectors)
        assert r["bytes"][step]["sent"] < 0.1 * base["bytes"][step]["sent"]
    torch.testing.assert_close(r["params"][0], r["params"][1], rtol=0, atol=0)


def test_powersgd_with_several_buckets_on_gloo_does_not_hang(results):
    """The parameters span several buckets whose PowerSGD callbacks are in flight at once (with
    gloo's default 2 worker threads this hung; training.comm_hooks.powersgd_gloo_group)."""
    r = results["powersgd-buckets"]
    assert r["bytes"][STEPS - 1]["calls"] >= 2 * results["powersgd"]["bytes"][STEPS - 1]["calls"]  # >= 2 buckets
    assert r["bytes"][STEPS - 1]["sent"] < 0.05 * 4 * r["numel"]
    torch.testing.assert_close(r["params"][0], r["params"][1], rtol=0, atol=0)


def test_grad_ema_under_ddp_keeps_replicas_identical(results):
    r, plain = results["ema"], results["none"]
    torch.testing.assert_close(r["params"][0], r["params"][1], rtol=0, atol=0)
    # the same data and the same first step (g~_0 = g_0), then different steps
    torch.testing.assert_close(r["ddp"][0][0], plain["ddp"][0][0], rtol=0, atol=0)
    assert not torch.equal(r["params"][0], plain["params"][0])


def test_int8_quantize_codes_and_scale():
    t = torch.tensor([0.0, 1.0, -2.54, 0.3])
    codes, scale = int8_quantize(t)
    assert codes.dtype == torch.int8
    assert float(scale) == pytest.approx(2.54 / 127)
    assert codes.tolist() == [0, 50, -127, 15]
    assert (codes.float() * scale - t).abs().max() <= scale / 2 + 1e-7
    zero_codes, zero_scale = int8_quantize(torch.zeros(3))
    assert zero_codes.tolist() == [0, 0, 0] and float(zero_scale) == 1.0


def test_counter_ring_estimates():
    c = CommCounter(world_size=4)
    c.all_reduce(torch.zeros(100, dtype=torch.float32))  # 400 bytes, ring: 2 * 3/4 * 400
    c.all_gather(torch.zeros(100, dtype=torch.int8))  # 100 bytes to each of 3 others
    assert c.take() == {"payload": 500.0, "sent": 600.0 + 300.0, "calls": 2}
    assert c.take() == {"payload": 0.0, "sent": 0.0, "calls": 0}


def test_comm_config_validation_and_run_config():
    with pytest.raises(ValueError, match="training.comm.hook='zip'"):
        CommConfig(hook="zip")
    with pytest.raises(ValueError, match="powersgd_start_step"):
        CommConfig(powersgd_start_step=1)
    cfg = RunConfig.from_dict(
        {"training": {"comm": {"hook": "int8", "bucket_cap_mb": 4}}, "paths": {"shards": "s", "out": "o"}}
    )
    assert cfg.training.comm.hook == "int8" and cfg.training.comm.bucket_cap_mb == 4.0
    assert RunConfig.from_dict({"paths": {"shards": "s", "out": "o"}}).training.comm == CommConfig()
