"""FedTAN's synchronised step with clients spread over processes (gloo over loopback)."""

import copy
import dataclasses
import datetime
import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from fednorm.models import get_model

SIZES = [5, 3, 8]  # three clients with unequal batches
PLACEMENT = {0: [0, 1], 1: [2]}  # rank -> its clients


def _batches():
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, 3, 8, 8, generator=g, dtype=torch.float64) * (1 + i) + 0.5 * i for i, n in enumerate(SIZES)]
    ys = [torch.randint(2 * i % 4, 2 * i % 4 + 2, (n,), generator=g) for i, n in enumerate(SIZES)]
    return xs, ys


def _worker(rank: int, world: int, tmp: str) -> None:
    from fednorm.distributed import DistributedClientComm
    from fednorm.engine.lockstep import scale_client_grads, synced_loss
    from fednorm.nn.stacked import set_client_comm, stack_model

    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        model = get_model("resnet20", num_classes=4, in_channels=3, input_size=8, norm="bn").double()
        xs, ys = _batches()
        mine = PLACEMENT[rank]
        comm = DistributedClientComm()
        stacked = stack_model(model, len(mine), verify=False)
        stacked.train()
        set_client_comm(stacked, comm)
        losses, total, p = synced_loss(stacked, stacked, [xs[i] for i in mine], [ys[i] for i in mine],
                                       total_batch=sum(SIZES))
        total.backward()
        params = dict(stacked.named_parameters())
        scale_client_grads(params, 1.0 / p)
        # Σ_i p_i g_i over this rank's clients, then over ranks: FedTAN's aggregate gradient
        weighted = {n: torch.tensordot(p, t.grad, dims=1) for n, t in params.items()}
        for t in weighted.values():
            dist.all_reduce(t)

        central = copy.deepcopy(model)
        central.train()
        per_sample = F.cross_entropy(central(torch.cat(xs)), torch.cat(ys), reduction="none")
        per_sample.mean().backward()
        bounds = torch.tensor([0] + SIZES).cumsum(0)
        err = 0.0
        for n, t in central.named_parameters():
            err = max(err, float((weighted[n] - t.grad).abs().max() / t.grad.abs().max().clamp(min=1e-12)))
        loss_err = max(
            abs(float(losses[j]) - float(per_sample[bounds[i] : bounds[i + 1]].mean())) for j, i in enumerate(mine)
        )
        with open(f"{tmp}/rank{rank}.json", "w") as f:
            json.dump({"grad_rel_err": err, "loss_err": loss_err, "clients": len(mine),
                       "traffic": dataclasses.asdict(comm.traffic), "bytes": comm.bytes_sent,
                       "statistics": sum(2 * m.num_features for m in model.modules()
                                         if isinstance(m, torch.nn.BatchNorm2d))}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_synchronised_step_across_processes_equals_centralized_bn(tmp_path):
    """Two processes (clients {0, 1} and {2}) reduce their BN statistics with gloo all-reduces; the
    p-weighted gradient summed over ranks equals centralized BN's gradient on the union batch.
    Each rank counts the paper's exchanges (3 per BN layer, the batch sizes being known) and its
    own clients' bytes; added up they are the three clients' traffic."""
    from fednorm.nn.comm import CommTraffic

    mp.spawn(_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for res in results:
        assert res["grad_rel_err"] < 1e-10
        assert res["loss_err"] < 1e-12
        assert res["traffic"]["exchanges"] == 3 * 19  # mean, variance, both gradients per BN layer
        per_client = 2 * res["statistics"] * 8  # statistics, then their gradients; float64
        assert res["traffic"]["uplink_bytes"] == res["clients"] * per_client
        assert res["traffic"]["broadcast_bytes"] == per_client
    total = CommTraffic.across_ranks([CommTraffic(**res["traffic"]) for res in results])
    assert total.uplink_bytes == total.downlink_bytes == len(SIZES) * per_client
    assert total.exchanges == 3 * 19
    assert results[0]["bytes"] > 0
