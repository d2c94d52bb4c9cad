"""The engines a run can use, and the one place that opens one: ``--engine hf`` (vlmfast's own engine on
transformers) or ``--engine vllm``."""

from __future__ import annotations

from vlmfast.engines.contract import Backend

ENGINES = ("hf", "vllm")


def open_backend(options, found, loaded, dist) -> Backend:
    """The engine ``options`` ask for, on the located checkpoint (or an already ``loaded`` model). The
    compile cache is pointed at before the model loads; vLLM itself starts in :meth:`Backend.ready`."""
    from vlmfast.errors import UsageError

    if options.engine == "vllm":
        if dist.world > 1:
            raise UsageError("--engine vllm runs its own processes: launch vlmfast once, without accelerate",
                             hint="use --data-parallel-size N and/or --tensor-parallel-size N")
        from vlmfast.engines.vllm.backend import open_vllm

        return open_vllm(options, found)
    from vlmfast.engines.hf.backend import open_hf

    return open_hf(options, found, loaded, dist)
