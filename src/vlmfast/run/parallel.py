"""Data parallel through accelerate: ``accelerate launch [--num_processes N] -m vlmfast infer …``.

Each process loads the model on its own device and takes its shard of the inputs (accelerate's own
contiguous split); the main process merges every shard into one JSONL in input order. A single
process (the usual case) never imports accelerate. With ``--engine vllm`` each process starts its own
vLLM engine on its own GPUs, and the processes meet over gloo (:mod:`vlmfast.engines.vllm.replicas`).
"""

from __future__ import annotations

import os

import traceback
from pathlib import Path

from vlmfast.errors import EXIT_FAILURE, UsageError, VlmfastError


def launched_world_size() -> int:
    """Processes in this launch, from the environment accelerate/torchrun set (1 when not launched)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def refuse_launched(command: str) -> None:
    """``sweep`` and ``bench`` run in one process: under a launcher every process would run the whole command
    (``bench``: N benchmarks timing each other, N reports; ``sweep``: the processes refused by each other's
    lock on ``--out-dir``). Refused on every process before anything loads (rank 0 says it)."""
    world = launched_world_size()
    if world > 1:
        raise UsageError(f"{command} runs in one process, but this one was launched as one of {world} "
                         "(WORLD_SIZE is set by accelerate launch or torchrun)",
                         hint=f"run `vlmfast {command}` without the launcher (several GPUs: `--engine vllm "
                              "--tensor-parallel-size N`, or `accelerate launch … -m vlmfast infer` per checkpoint)")


def is_main_process() -> bool:
    """Cheap check for the CLI: only rank 0 renders errors and reports."""
    return os.environ.get("RANK", "0") in ("", "0")


class Distributed:
    """Rank, world size, device and the three collectives vlmfast needs; no-ops for one process."""

    def __init__(self, gloo: bool = False):
        """``gloo``: the collectives on the CPU whatever the machine has, and no GPU taken by this process (each
        process's vLLM engine takes its own, and checks them: :mod:`vlmfast.engines.vllm.replicas`)."""
        self.world = launched_world_size()
        self.rank = 0
        self.device = None  # None: let the loader decide
        self._state = None
        if self.world > 1:
            import torch
            from accelerate import PartialState

            # Under ``gloo`` CUDA is not asked about at all: torch.cuda.is_available() calls cudaGetDeviceCount,
            # which initialises the CUDA driver here (with the launch's CUDA_VISIBLE_DEVICES, not the engine's)
            # and poisons fork, so vLLM's engine core, forked by default, could not start CUDA ("Cannot
            # re-initialize CUDA in forked subprocess"). The engine asks its own platform (NVML) instead.
            cuda = False if gloo else torch.cuda.is_available()
            if not gloo:
                check_devices(self.world, cuda, torch.cuda.device_count() if cuda else 0)
            # On a machine without CUDA accelerate only starts its gloo backend when told cpu=True.
            missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK") if not os.environ.get(k)]
            if missing:  # WORLD_SIZE without a launcher (exported by hand, or left from another job)
                raise UsageError(f"WORLD_SIZE={self.world} is set, but {', '.join(missing)} is not: this process was "
                                 "not started by a launcher", hint="unset WORLD_SIZE for one process, or launch it with "
                                 "accelerate launch --num_processes N -m vlmfast infer … (or torchrun)")
            self._state = PartialState(cpu=gloo or not cuda)
            self.rank = self._state.process_index
            self.world = self._state.num_processes
            device = str(self._state.device)
            self.device = "cpu" if device.startswith("cpu") else device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self._state is not None:
            self._state.wait_for_everyone()

    def split(self, items: list) -> list:
        """This process's contiguous share of ``items`` (the same split on every process)."""
        if self._state is None:
            return list(items)
        with self._state.split_between_processes(list(items)) as mine:
            return list(mine)

    def any(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on any: the collective that lets one process's
        failure end the run everywhere at the next batch boundary instead of at a barrier's timeout."""
        return self.reduce_max(int(flag)) > 0

    def settle(self, refusal: VlmfastError | None) -> None:
        """After a step only the main process takes (the results file's checks): its refusal stops every
        process here, each with its exit code (rank 0 says it), instead of the others meeting a collective
        their main process left ("Connection closed by peer" tracebacks, or a hang until a timeout)."""
        if self._state is None:
            if refusal is not None:
                raise refusal
            return
        code = self.reduce_max(refusal.exit_code if refusal is not None else 0)
        if refusal is not None:
            raise refusal
        if code:
            error = VlmfastError("the main process refused this run (it says why)")
            error.exit_code = code
            raise error

    def reduce_max(self, value: int) -> int:
        """The largest ``value`` over every process (a no-op for one process)."""
        if self._state is None:
            return value
        import torch
        import torch.distributed as td

        t = torch.tensor([value], device=self._state.device)
        td.all_reduce(t, op=td.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj) -> list:
        """Every process's ``obj``, in rank order, on every process."""
        if self._state is None:
            return [obj]
        from accelerate.utils import gather_object

        return gather_object([obj])


def check_devices(world: int, cuda: bool, device_count: int) -> None:
    """One GPU per process: more processes than GPUs would crash at the first collective with
    "invalid device ordinal", after every process loaded the model. Refuse before anything starts."""
    if cuda and world > device_count:
        raise UsageError(
            f"{world} processes but this machine has {device_count} CUDA device(s): one process per GPU",
            hint=f"launch with --num_processes {device_count} (or fewer)",
        )


class RunFailed(VlmfastError):
    """A process of a parallel run failed; every process stops at the same batch boundary."""

    exit_code = EXIT_FAILURE


def fail_together(dist: Distributed, failure: BaseException | None, out: Path | None, overwrite: bool = False):
    """Every process raises the same RunFailed naming the process that failed and why; the failing
    process also prints its traceback (its own stderr, once)."""
    from vlmfast.run.results import resume_hint

    if failure is not None and not isinstance(failure, VlmfastError):
        traceback.print_exception(failure)
    said = f"{type(failure).__name__}: {getattr(failure, 'message', failure)}" if failure is not None else None
    reasons = [(rank, text) for rank, text in enumerate(dist.gather(said)) if text is not None]
    listing = "; ".join(f"process {rank}: {text}" for rank, text in reasons)
    raise RunFailed(f"{len(reasons)} of {dist.world} processes failed ({listing}); every process stopped",
                    hint=f"finished batches are kept{f' beside {out}' if out else ''}; " + resume_hint(overwrite))
