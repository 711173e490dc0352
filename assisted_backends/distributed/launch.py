"""Multi-card launches: DeepSpeed AutoTP shards the target, every rank keeps a full draft replica.

`deepspeed --num_gpus N ...` and `torchrun --nproc_per_node N ...` both set WORLD_SIZE, RANK and
LOCAL_RANK; `launch_context()` reads them. The flow a front end follows:

    context = launch_context()               # None: a plain single-process run
    if context is not None:
        init_distributed(context, device)    # hccl on hpu, gloo on cpu
        target = shard_target(target, context)
    ... assisted_backends.generate(target, ..., assistant_model=draft, seed=seed)
    if is_main_process(): print(...)

Every rank runs the whole loop on identical tokens: the sharded forward all-reduces inside the
target, so logits (and thus accept decisions) agree across ranks and shapes stay in lockstep.
`generate` itself makes every other decision the same on every rank (rank 0's seed when none is
given, rank 0's γ under the adaptive schedule) and checks the rest: `distributed.agreement`. Every
collective, the target's all-reduces included, is bounded by `ASSISTED_BACKENDS_COLLECTIVE_TIMEOUT_S`
(default 300 s; also the bound on joining the group): a stuck peer ends the run with an error.
deepspeed (and habana_frameworks on hpu) are imported inside these functions only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch

from assisted_backends.distributed.agreement import collective_timeout_s
from assisted_backends.extras import install_hint

DIST_BACKENDS = {"hpu": "hccl", "cpu": "gloo", "cuda": "nccl"}
_INSTALL_HINT = install_hint("deepspeed")


@dataclass(frozen=True)
class LaunchContext:
    """Where this process sits in a distributed launch (set by `deepspeed` or `torchrun`)."""

    world_size: int
    rank: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = environ.get(name)
    if value is None:
        if default is None:
            raise RuntimeError(f"{name} is not set although WORLD_SIZE is; launch with `deepspeed` or `torchrun`")
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be an integer") from None


def launch_context(environ: Mapping[str, str] | None = None) -> LaunchContext | None:
    """The launch this process belongs to, or None when it runs alone (WORLD_SIZE unset or 1)."""
    environ = os.environ if environ is None else environ
    world_size = _env_int(environ, "WORLD_SIZE", 1)
    if world_size <= 1:
        return None
    rank = _env_int(environ, "RANK")
    local_rank = _env_int(environ, "LOCAL_RANK", rank)
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} is outside [0, WORLD_SIZE={world_size})")
    return LaunchContext(world_size=world_size, rank=rank, local_rank=local_rank)


def is_main_process() -> bool:
    """True on rank 0 and in single-process runs: only this process should print or write files."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    context = launch_context()
    return context is None or context.is_main


def _import_deepspeed(device: str):
    os.environ.setdefault("DS_ACCELERATOR", device)  # never let DeepSpeed guess another accelerator
    try:
        import deepspeed
    except ImportError as error:
        raise ImportError(f"a multi-process launch needs DeepSpeed: {_INSTALL_HINT} ({error})") from error
    return deepspeed


def _skip_shared_memory_all_reduce(deepspeed) -> None:
    """Make DeepSpeed all-reduce through the process group (gloo/hccl), never its CPU shared-memory kernel.

    DeepSpeed JIT-builds and loads that kernel while it joins the process group, if its op table
    marks it compatible; marking it incompatible first means it is never compiled nor loaded, and
    `inference_all_reduce` falls back to `torch.distributed.all_reduce`. The kernel crashed on the
    Xeon hosts this was developed on, costs a C++ build on first use, and has no role with hccl.
    """
    compatible = deepspeed.ops.__compatible_ops__  # probed once per process, then cached in the module
    for name in list(compatible):
        if name.endswith("shm_comm"):
            compatible[name] = False


def _check_no_shared_memory_kernel(deepspeed) -> None:
    backend = getattr(deepspeed.comm.comm, "cdb", None)
    if getattr(backend, "shm_comm_op", None) is not None:
        raise RuntimeError("DeepSpeed loaded its shared-memory all-reduce although it was disabled; report this")


def init_distributed(context: LaunchContext, device: str) -> None:
    """Join the process group: `hccl` on hpu, `gloo` on cpu (`nccl` on cuda). Idempotent.

    The group's timeout, which bounds joining it and every collective on it (the target's
    all-reduces), is `collective_timeout_s()` (`ASSISTED_BACKENDS_COLLECTIVE_TIMEOUT_S`, default 300 s).
    """
    timeout = timedelta(seconds=collective_timeout_s())  # a bad value fails here, before any peer waits
    if device not in DIST_BACKENDS:
        raise ValueError(f"device={device!r} has no distributed backend; choose one of {sorted(DIST_BACKENDS)}")
    if device == "hpu":
        try:
            import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers the hccl backend)
        except ImportError as error:
            raise ImportError(f"device='hpu' needs habana_frameworks: {install_hint('gaudi')} ({error})") from error
    deepspeed = _import_deepspeed(device)
    _skip_shared_memory_all_reduce(deepspeed)
    deepspeed.init_distributed(
        dist_backend=DIST_BACKENDS[device],
        rank=context.rank,
        world_size=context.world_size,
        verbose=False,
        timeout=timeout,
    )
    _check_no_shared_memory_kernel(deepspeed)
    world = torch.distributed.get_world_size()
    if world != context.world_size:
        raise RuntimeError(f"process group has {world} ranks but WORLD_SIZE={context.world_size}")


def shutdown(wait_for_peers: bool = True) -> None:
    """Leave the process group, if this process joined one.

    Every rank first waits for the others (after a successful run), then the group is destroyed, so
    that no communication thread is still running when the interpreter exits: otherwise gloo can
    abort the process at exit ("terminate called without an active exception") after all the work
    is done. After an error the peers may never arrive, so `wait_for_peers=False` skips the barrier.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if wait_for_peers:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def shard_target(model: torch.nn.Module, context: LaunchContext, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Tensor-parallel target over all ranks with DeepSpeed AutoTP (no kernel injection).

    Linear layers are split across `world_size` ranks and their partial outputs all-reduced, so
    the returned module computes the same logits as `model` on every rank. Call after
    `init_distributed`. The draft is never sharded: it is small and each rank runs a full replica.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise RuntimeError("shard_target needs the process group: call init_distributed(context, device) first")
    import deepspeed  # imported by init_distributed already; a cheap lookup here

    dtype = dtype or next(model.parameters()).dtype
    # DeepSpeed would create its tensor-parallel group with torch's default timeout (30 min); the group
    # handed over here bounds the target's all-reduces by ASSISTED_BACKENDS_COLLECTIVE_TIMEOUT_S instead.
    group = torch.distributed.new_group(timeout=timedelta(seconds=collective_timeout_s()))
    deepspeed.get_accelerator().set_device(context.local_rank)  # what DeepSpeed does when it makes the group
    engine = deepspeed.init_inference(
        model,
        # `mpu` stops DeepSpeed from making a group of its own, `tp_group` is what the sharded layers all-reduce over
        tensor_parallel={"tp_size": context.world_size, "mpu": _ModelParallelUnit(group), "tp_group": group},
        dtype=dtype,
        replace_with_kernel_inject=False,
    )
    return engine.module


class _ModelParallelUnit:
    """DeepSpeed's `mpu` protocol for one tensor-parallel group over every rank (no data parallelism)."""

    def __init__(self, group) -> None:
        self.group = group

    def get_model_parallel_group(self):
        return self.group

    def get_model_parallel_rank(self) -> int:
        return torch.distributed.get_rank(self.group)

    def get_model_parallel_world_size(self) -> int:
        return torch.distributed.get_world_size(self.group)

    def get_data_parallel_group(self):
        return None

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_data_parallel_world_size(self) -> int:
        return 1


def per_rank_path(path: str | None) -> str | None:
    """An output path for this rank: `{rank}` in it is replaced by the rank (0 in a single process);
    a path without `{rank}` is rank 0's alone (None on the other ranks)."""
    if path is None:
        return None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank = torch.distributed.get_rank()
    else:
        context = launch_context()
        rank = 0 if context is None else context.rank
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    return path if rank == 0 else None
