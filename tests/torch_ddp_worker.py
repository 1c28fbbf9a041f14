"""DistributedDataParallel over ORTModule, 2 CPU processes with gloo on the loopback interface.

``python torch_ddp_worker.py OUT.pt``: each rank trains on its half of one global batch, through
DDP(ORTModule(model)); rank 0 saves the averaged gradients, the loss, and the gradients of the
same model trained in one process on the whole batch, to OUT.pt. Used by test_torch_bridge.
"""

from __future__ import annotations

import copy
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))


def global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(8, 12, generator=gen), torch.randint(0, 3, (8,), generator=gen)


def worker(rank: int, port: int, out: str) -> None:
    from ortagent.torch import ORTModule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        model = make_model()
        ddp = nn.parallel.DistributedDataParallel(ORTModule(model))
        x, y = global_batch()
        half = x.shape[0] // WORLD
        mine = slice(rank * half, (rank + 1) * half)
        loss = nn.functional.cross_entropy(ddp(x[mine]), y[mine])
        loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        # a second step: the optimizer and DDP keep working
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        opt.step()
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x[mine]), y[mine]).backward()
        if rank == 0:
            single = make_model()
            nn.functional.cross_entropy(single(x), y).backward()
            torch.save({"ddp": grads, "single": {n: p.grad for n, p in single.named_parameters()},
                        "second_step_ok": all(p.grad is not None for p in model.parameters())}, out)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    mp.spawn(worker, args=(free_port(), sys.argv[1]), nprocs=WORLD, join=True)
