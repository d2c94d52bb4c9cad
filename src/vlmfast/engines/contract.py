"""The one interface the runner drives, whichever engine generates: :class:`Backend`, implemented by
:class:`~vlmfast.engines.hf.backend.HfBackend` (vlmfast's engine on transformers) and
:class:`~vlmfast.engines.vllm.backend.VllmBackend`. The runner and the report never ask which engine
runs: what differs is in :class:`~vlmfast.engines.facts.EngineFacts`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from vlmfast.engines.facts import EngineFacts
from vlmfast.inputs.requests import Request
from vlmfast.engines.rows import BatchTiming, SampleResult

Batch = tuple[list[int], list[SampleResult], BatchTiming | None]  # input indices, their rows, the batch's clocks


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

    def facts(self) -> EngineFacts: ...

    def close(self) -> None: ...
