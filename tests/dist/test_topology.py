"""Simulated hosts (TILECOMM_HOSTNAME per rank): topology discovery and the
hierarchical all-reduce on layouts with equal, unequal and interleaved hosts,
checked against the closed form and Gloo, bitwise identical on every rank."""

import os

import pytest
import torch
import torch.distributed as dist

from tilecomm import launch

LAYOUTS = {
    "2x2": ["a", "a", "b", "b"],
    "3-2-1": ["a", "a", "a", "b", "b", "c"],
    "interleaved": ["x", "y", "x", "y", "x"],
}


def _body(rank, world, labels, algo):
    os.environ["TILECOMM_HOSTNAME"] = labels[rank]
    os.environ["TILECOMM_ALGO"] = f"all_reduce:{algo}"
    import tilecomm

    dist.init_process_group("tilecomm", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    topo = tilecomm.topology()
    assert topo.labels == tuple(labels), topo
    assert topo.num_hosts == len(set(labels))
    assert sorted(r for _, ranks in topo.hosts for r in ranks) == list(range(world))
    for n in (0, 1, 7, 1001, 100003):
        for dtype, op in ((torch.float32, dist.ReduceOp.SUM), (torch.int64, dist.ReduceOp.SUM),
                          (torch.bfloat16, dist.ReduceOp.MAX), (torch.int32, dist.ReduceOp.PRODUCT)):
            g = torch.Generator().manual_seed(rank * 1000 + n)
            if dtype.is_floating_point:
                x = torch.randn(n, generator=g).to(dtype)
            elif op == dist.ReduceOp.PRODUCT:
                x = torch.randint(-2, 3, (n,), generator=g).to(dtype)
            else:
                x = torch.randint(-1000, 1000, (n,), generator=g).to(dtype)
            mine, ref = x.clone(), x.clone()
            dist.all_reduce(mine, op=op)
            dist.all_reduce(ref, op=op, group=gloo)
            what = f"{algo} {labels} n={n} {dtype} {op}"
            if dtype.is_floating_point and op == dist.ReduceOp.SUM:
                torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-4 * world, msg=what)
            else:
                assert torch.equal(mine, ref), what
            # Every rank holds the same bytes.
            raw = mine.view(torch.uint8) if n else torch.zeros(0, dtype=torch.uint8)
            outs = [torch.empty_like(raw) for _ in range(world)]
            dist.all_gather(outs, raw, group=gloo)
            assert all(torch.equal(o, outs[0]) for o in outs), what + ": ranks differ"
    dist.destroy_process_group()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("algo", ["hierarchical", "ring"])
def test_simulated_hosts(layout, algo):
    labels = LAYOUTS[layout]
    launch.run(_body, len(labels), labels, algo)
