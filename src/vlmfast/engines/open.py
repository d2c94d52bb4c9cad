"""The engines a run can use, and the one place that opens one: ``--engine hf`` (vlmfast's own engine on
transformers) or ``--engine vllm``. Each engine declares here how it opens and which run options it does
not take; :func:`check_engine_options` is the one check of them. An engine added to :data:`ENGINES`
(a test's double included) is an ``--engine`` choice of ``infer`` and ``sweep`` and an ``--engines``
entry of ``bench``, with nothing else to edit."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from vlmfast.engines.contract import Backend


@dataclass(frozen=True)
class EngineEntry:
    """An engine: ``opener`` (``"module:function"``, imported when the engine opens so ``--help`` stays
    light, or the function) is called as ``opener(options, found, loaded, dist)`` and returns a
    :class:`~vlmfast.engines.contract.Backend`. ``refuses``: the run options (fields of
    :class:`~vlmfast.run.options.InferOptions`) this engine does not take — given with a value other than
    their default, the run stops with ``refusal`` (``{flags}`` and ``{verb}`` filled in) and ``hint``.
    ``machine`` (``"module:function"`` or the function, or None): called as ``machine(options, dist)``, it
    raises what opening would refuse on this machine without opening anything (a run with nothing left to
    do loads nothing, and refuses the same options)."""

    opener: str | Callable
    refuses: tuple[str, ...] = ()
    refusal: str = "{flags} {verb} to another engine"
    hint: str = "drop them"
    machine: str | Callable | None = None

    def open(self, options, found, loaded, dist) -> Backend:
        return _imported(self.opener)(options, found, loaded, dist)


def _imported(function: str | Callable) -> Callable:
    if isinstance(function, str):
        module, name = function.split(":")
        return getattr(importlib.import_module(module), name)
    return function


ENGINES: dict[str, EngineEntry] = {
    "hf": EngineEntry(
        "vlmfast.engines.hf.backend:open_hf", refuses=("vllm",), machine="vlmfast.engines.hf.backend:check_machine",
        refusal="{flags} {verb} to --engine vllm",
        hint="add --engine vllm, or launch several processes with accelerate for the HF engine"),
    "vllm": EngineEntry(
        "vlmfast.engines.vllm.backend:open_vllm",
        refuses=("device", "attn", "decoder", "batching", "cuda_graphs", "compile", "overlap", "max_batch_tokens",
                 "allow_pickle", "allow_missing", "threads"),
        refusal="{flags} {verb} to vlmfast's own engine (--engine hf), not to --engine vllm",
        hint="drop them, or drop --engine vllm for vlmfast's own engine; vLLM picks its own device, attention, batching "
             "and CUDA graphs, and loads only whole weights"),
}


def check_engine_options(options) -> None:
    """Refuse the options ``options.engine`` does not take (see :class:`EngineEntry`); "auto" counts as not given."""
    from vlmfast.declared import default_of
    from vlmfast.errors import UsageError

    entry = ENGINES[options.engine]
    cls = type(options)
    given = [name for name in entry.refuses
             if getattr(options, name) != default_of(cls, name) and getattr(options, name) != "auto"]
    # a group of settings (--engine vllm's) is named by the flags given of it
    flags = [flag for name in given for flag in _given_flags(cls, name, getattr(options, name))]
    if flags:
        raise UsageError(entry.refusal.format(flags=", ".join(flags), verb="applies" if len(flags) == 1 else "apply"),
                         hint=entry.hint)


def _given_flags(cls, name: str, value) -> list[str]:
    """The flag of option ``name``; for a group of settings (a dataclass), the flags of those set off their default."""
    import dataclasses

    from vlmfast.declared import flag_of

    if not dataclasses.is_dataclass(value):
        return [flag_of(cls, name)]
    default = type(value)()
    return [flag_of(type(value), f.name) for f in dataclasses.fields(value) if getattr(value, f.name) != getattr(default, f.name)]


def check_machine(options, dist, opened: bool) -> None:
    """What opening ``options.engine`` would refuse on this machine, raised without opening it; nothing when
    a model or engine was handed in (``opened``: its device is decided)."""
    machine = ENGINES[options.engine].machine
    if machine is not None and not opened:
        _imported(machine)(options, dist)


def open_backend(options, found, loaded, dist) -> Backend:
    """The engine ``options`` ask for, on the located checkpoint (or an already ``loaded`` model). The
    compile cache is pointed at before the model loads; vLLM itself starts in :meth:`Backend.ready`."""
    return ENGINES[options.engine].open(options, found, loaded, dist)
