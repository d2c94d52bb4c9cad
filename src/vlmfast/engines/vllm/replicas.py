"""Data parallel on vLLM: ``accelerate launch --num_processes N -m vlmfast infer --engine vllm …`` runs one vLLM
engine per process, each on its own GPUs and its own share of the requests; the main process merges the shares
into one results file, as for vlmfast's engine (:mod:`vlmfast.run.parallel`). This is vLLM's own recipe for
offline data parallelism (a process per replica, its devices chosen before the engine starts), not a scheduler
of vlmfast's: each engine is a whole, ordinary vLLM.

A replica takes tensor × pipeline parallel GPUs: the process of local rank k takes the k-th run of that many
devices the launch sees (``CUDA_VISIBLE_DEVICES``, else all). While vLLM starts, the launcher's variables
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, …) are hidden from it, as vLLM's torchrun data-parallel
example deletes them: each engine is a launch of one, whose workers vLLM places itself; and its processes are
spawned (:func:`replica_env`). The launched processes meet over gloo and never ask torch about CUDA."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from vlmfast.errors import UsageError

# what torchrun and accelerate launch set for each process; vLLM reads some of them as a launch of its own
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


@dataclass(frozen=True)
class Replica:
    """One process's vLLM engine in a data-parallel launch."""

    rank: int  # the process's index in the launch
    world: int  # processes in the launch: engines
    devices: tuple[str, ...] | None  # the CUDA devices it takes, as CUDA_VISIBLE_DEVICES names them; None: a CPU

    def has_share(self, requests: int) -> bool:
        """Whether this process gets any of ``requests``: the launch splits them in contiguous shares, the first
        ``requests % world`` one longer (accelerate's ``split_between_processes``), so a rank past the last
        request gets none."""
        return self.rank < requests

    def described(self) -> dict:
        return {"data_parallel_rank": self.rank, "data_parallel_engines": self.world,
                "devices": None if self.devices is None else ",".join(self.devices)}


def replica_for(rank: int, world: int, settings, *, cuda: bool | None = None, visible: list[str] | None = None,
                environ=os.environ) -> Replica | None:
    """This process's replica in a launch of ``world`` processes (None for one process), its devices checked
    before any engine starts. ``cuda``: whether the replicas take GPUs (default: vLLM's platform says, from
    NVML: ``torch.cuda.is_available()`` would start CUDA in this process, see :func:`replica_env`). ``visible``:
    the launch's CUDA devices (default: CUDA_VISIBLE_DEVICES, else all)."""
    if world <= 1:
        return None
    if cuda is None:
        from vlmfast.engines.vllm.support import import_vllm

        import_vllm()  # its settings first, its logs on stderr
        from vllm.platforms import current_platform

        cuda = bool(current_platform.is_cuda_alike())
    if settings.distributed_executor_backend in ("ray", "external_launcher"):
        raise UsageError(f"--distributed-executor-backend {settings.distributed_executor_backend} with {world} launched "
                         "processes: each process runs its own vLLM engine, which places its workers on this node",
                         hint="launch once without accelerate for a Ray cluster, or drop the option for one engine per process")
    if environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        raise UsageError(f"VLLM_ENABLE_V1_MULTIPROCESSING=0 with {world} launched processes: vLLM's engine would run inside "
                         "this process, which already belongs to the launch's process group (vLLM would take that group, "
                         "of every launched process, for its own) and may already have started CUDA on every GPU",
                         hint="unset VLLM_ENABLE_V1_MULTIPROCESSING under accelerate launch")
    if not cuda:
        return Replica(rank, world, None)
    per_engine = settings.tensor_parallel_size * settings.pipeline_parallel_size
    visible = launch_devices() if visible is None else visible
    local_rank = int(environ.get("LOCAL_RANK", rank))
    local_world = int(environ.get("LOCAL_WORLD_SIZE", world))
    if local_world * per_engine > len(visible):
        raise UsageError(f"{local_world} processes on this node × {per_engine} GPU(s) per vLLM engine (tensor × pipeline "
                         f"parallel) need {local_world * per_engine} GPUs; this node has {len(visible)}",
                         hint=f"launch with --num_processes {max(1, len(visible) // per_engine)} (or fewer), or lower "
                              "--tensor-parallel-size")
    return Replica(rank, world, tuple(visible[local_rank * per_engine:(local_rank + 1) * per_engine]))


def launch_devices() -> list[str]:
    """The CUDA devices this launch may use, as CUDA_VISIBLE_DEVICES names them (all, when it is not set)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None and given.strip():
        return [d.strip() for d in given.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]  # counted without starting CUDA in this process


@contextlib.contextmanager
def replica_env(replica: Replica | None, environ=os.environ):
    """The environment vLLM starts its engine in: the replica's devices, no launcher variables, and its processes
    spawned, not forked (``VLLM_WORKER_MULTIPROC_METHOD=spawn``): a forked engine core would inherit this process's
    torch.distributed group — the launch's, which vLLM then takes for its own world (``init_distributed_environment``
    skips its own when one is initialised) — and, where CUDA was initialised here, could not start CUDA. vLLM's
    CPU platform spawns anyway. Restored afterwards (the launch's collectives still need its variables)."""
    if replica is None:
        yield
        return
    keys = (*LAUNCHER_VARIABLES, "CUDA_VISIBLE_DEVICES", "VLLM_WORKER_MULTIPROC_METHOD")
    saved = {k: environ.get(k) for k in keys}
    try:
        for k in LAUNCHER_VARIABLES:
            environ.pop(k, None)
        environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        if replica.devices is not None:
            environ["CUDA_VISIBLE_DEVICES"] = ",".join(replica.devices)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                environ.pop(k, None)
            else:
                environ[k] = v
