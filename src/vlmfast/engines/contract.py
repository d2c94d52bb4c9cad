"""The one interface the runner drives, whichever engine generates: :class:`Backend`, implemented by
:class:`~vlmfast.engines.hf.backend.HfBackend` (vlmfast's engine on transformers) and
:class:`~vlmfast.engines.vllm.backend.VllmBackend`. The runner and the report never ask which engine
runs: what differs is in :class:`~vlmfast.engines.facts.EngineFacts`. A sweep moves one backend from
checkpoint to checkpoint with :meth:`Backend.switch_to` and hears what the engine checked on its own through
:meth:`Backend.news`: no caller asks an engine for anything the protocol does not name."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple, Protocol

from vlmfast.engines.facts import EngineFacts
from vlmfast.inputs.requests import Request
from vlmfast.engines.rows import BatchTiming, SampleResult

Batch = tuple[list[int], list[SampleResult], BatchTiming | None]  # input indices, their rows, the batch's clocks


class Switched(NamedTuple):
    """How a backend moved to the next checkpoint: ``how`` "swap" (weights copied into the loaded model),
    "reload" (weights reloaded into the running engine), "load" (loaded afresh) or None (not possible: the
    caller closes this backend and opens a new one); ``why`` says why it was not in place."""

    how: str | None
    seconds: float
    why: str | None = None

    @classmethod
    def impossible(cls, why: str) -> Switched:
        return cls(None, 0.0, why)


class Backend(Protocol):
    device: str

    def context_problems(self, requests: Sequence[Request], image_sizes: dict) -> dict[str, str]:
        """Requests whose prompt leaves no room in the model's context, by id (with the reason)."""

    def ready(self, requests: Sequence[Request], image_sizes: dict, requested: int | None) -> tuple[int, str | None]:
        """Get ready to run ``requests``: the batch size (``requested``, or the engine's own choice, with
        a note saying why)."""

    def plan(self, requests: Sequence[Request], image_sizes: dict, batch_size: int) -> list[list[int]]:
        """Indices of ``requests``, grouped into the batches :meth:`batches` will run."""

    def batches(self, requests: Sequence[Request], image_sizes: dict, planned: list[list[int]]) -> Iterator[list[Batch]]:
        """For each planned batch, what it produced: one item, or several when it was split."""

    def switch_to(self, found, canary: int | None = None) -> Switched:
        """Run the next checkpoint ``found`` (located) from now on, in place when it can. ``canary``: after
        the first in-place reload, check that many requests against a freshly loaded engine (0: no check;
        None: the engine's default; an engine whose in-place change is exact ignores it)."""

    def news(self) -> tuple[dict, list[str]]:
        """What the engine checked on its own since last asked: figures for the report (e.g.
        ``{"canary_s": 1.2}``) and notes, each said once."""

    def facts(self) -> EngineFacts: ...

    def close(self) -> None: ...
