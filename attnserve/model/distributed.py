"""Data-parallel plumbing for training under torchrun: who am I, which device and precision,
agreeing ranks.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them this is a single process and
every collective here is a no-op. gloo on CPU, NCCL on CUDA. Knows nothing of models or data.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist


class DeviceError(Exception):
    """The requested device cannot be used (a one-line reason)."""


@dataclass(frozen=True)
class Ranks:
    rank: int = 0  # global rank of this process (0 prints and writes checkpoints)
    world_size: int = 1  # processes in the job
    local_rank: int = 0  # rank on this machine: picks the GPU
    local_world: int = 1  # processes on this machine: share its CPU cores

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def ranks_from_env() -> Ranks:
    """This process's place in a torchrun job (rank 0 of 1 when not launched by torchrun)."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    return Ranks(
        rank=int(env.get("RANK", "0")),
        world_size=world,
        local_rank=int(env.get("LOCAL_RANK", "0")),
        local_world=int(env.get("LOCAL_WORLD_SIZE", str(world))),
    )


def pick_device(kind: str, ranks: Ranks) -> torch.device:
    """cpu, or this rank's GPU; a clear error when CUDA is asked for and absent."""
    if kind == "cpu":
        return torch.device("cpu")
    if kind != "cuda":
        raise DeviceError(f"unknown device {kind!r}; choose cpu or cuda")
    if not torch.cuda.is_available():
        raise DeviceError("--device cuda: CUDA is not available (no GPU, or a CPU-only torch build)")
    if ranks.local_rank >= torch.cuda.device_count():
        raise DeviceError(f"local rank {ranks.local_rank} has no GPU ({torch.cuda.device_count()} visible)")
    torch.cuda.set_device(ranks.local_rank)
    return torch.device("cuda", ranks.local_rank)


def cpu_threads(ranks: Ranks, requested: int | None) -> int:
    """Threads per process: the cores shared among this machine's processes, unless told."""
    if requested:
        return requested
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, (os.cpu_count() or 1) // ranks.local_world)


def native_bf16(device: torch.device) -> bool:
    """True where bfloat16 matmuls run in hardware (CUDA Ampere+, CPUs with AVX512-BF16 or AMX)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bfloat16 autocast for "bf16", and for "auto" where the hardware has it; None is float32."""
    if precision == "bf16" or (precision == "auto" and native_bf16(device)):
        return torch.bfloat16
    return None


@contextmanager
def process_group(ranks: Ranks, device: torch.device) -> Iterator[None]:
    """Inside, this process is in the job's group (gloo on CPU, NCCL on CUDA); left on the way out
    if this call joined it. A single process joins nothing."""
    created = ranks.distributed and not dist.is_initialized()
    if created:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=ranks.rank, world_size=ranks.world_size)
    try:
        yield
    finally:
        if created and dist.is_initialized():
            gc.collect()  # a DDP wrapper left in a reference cycle must release the group before it goes
            dist.destroy_process_group()


def broadcast_float(value: float, device: torch.device) -> float:
    """Rank 0's value on every rank, so that all ranks take the same decisions (stop, lr)."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return float(t.item())


def sum_all(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sum over ranks."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
