"""Which static decode shapes an engine holds, builds and compiles: a mixin of
:class:`~vlmfast.engines.hf.engine.Engine`.

A static decode state serves one (rows bucket, cache length bucket) shape: CUDA graphs are captured and
the step compiled per shape. At most RESIDENT_SHAPES stay built (least recently used released first).
Whether to compile at all, when nobody said, is decided after the first batch (or mid-way through a
continuous run) from what the steps still to come would save: :mod:`vlmfast.engines.hf.compile_policy`.
"""

from __future__ import annotations

from collections.abc import Sequence

from vlmfast.engines.hf.capacity import RESIDENT_SHAPES, batch_bucket, length_bucket
from vlmfast.engines.rows import BatchTiming
from vlmfast.inputs.requests import Request
from vlmfast.timing import free_device_cache


class DecodeShapes:
    """The engine's static decode states by shape (``_static``: (rows, cache length) → state, least recently
    used first), built on first use and let go when the compile decision changes what they should be."""

    def _static_state(self):
        """The static state of this batch's shape, built (captured / compiled) on first use, its time in
        ``compile_s``. At most RESIDENT_SHAPES stay built; the least recently used is released, its memory
        freed now (a run alternating between two shapes keeps both, whatever a third one did)."""
        shape = self.last_shape
        if shape in self._static:
            self._static[shape] = self._static.pop(shape)  # most recently used: last in line for eviction
            return self._static[shape]
        while len(self._static) >= RESIDENT_SHAPES["cuda" if self.on_cuda else "cpu"]:
            self._static.pop(next(iter(self._static))).release()
            free_device_cache()
        self._static[shape] = self.policy.timed(lambda: self._build_static(shape))
        return self._static[shape]

    def _build_static(self, shape: tuple[int, int]):
        state = self._new_state(shape[0], shape[1], static=True, forward=self.policy.forward())
        # capturing runs the step (and compiles it); a compiled step on a CPU compiles at its first call
        if self.policy.build(self.shape_key(shape), state.capture if self.cuda_graphs else state.warm_up):
            return state
        state.release()
        return self._build_static(shape)  # the compile failed: the policy is off now, build uncompiled

    def decide_compile(self, first: BatchTiming, later: list[tuple[int, int]]) -> None:
        """After the first batch, when nobody said ``--compile`` / ``--no-compile``: compile the decode step
        for the rest of the run if what it would save outweighs what it costs — one compile per decode
        shape of the ``later`` batches (:meth:`planned_shapes`), and on CUDA the vision blocks, whose saving
        is counted on the first batch's vision seconds for each batch to come; the policy decides."""
        if not self.policy.undecided or not later or first.steps < 2 or first.decode_s <= 0 or self.last_shape is None:
            return
        step_ms = first.decode_s * 1000 / (first.steps - 1)
        shapes = list(dict.fromkeys(later))
        vision_s = (first.vision_s or 0.0) * len(later) if self.compile_vision else 0.0
        if self.policy.decide([self.shape_key(s) for s in shapes], step_ms=step_ms,
                              remaining_steps=len(later) * first.steps, vision_s=vision_s):
            self.forget_shapes()  # later batches build compiled decode steps

    def decide_compile_now(self, step_ms: float, remaining_steps: int) -> bool:
        """Mid-way through a continuous run, when nobody said ``--compile`` / ``--no-compile``: whether the
        steps still to come repay compiling this run's decode shape. When they do, the shapes built so far
        are let go (the caller's state moves into a compiled one with :meth:`continuous_state`)."""
        if not self.policy.undecided or self.last_shape is None:
            return False
        if not self.policy.decide([self.shape_key(self.last_shape)], step_ms=step_ms, remaining_steps=remaining_steps):
            return False
        self._static.clear()  # not released: the running state's rows move out of it first
        return True

    def planned_shapes(self, requests: Sequence[Request], image_sizes: dict, planned: list[list[int]]) -> list[tuple[int, int]]:
        """The static decode shape (batch, cache length) each planned batch will likely take (prompt lengths
        estimated as :meth:`cost` does)."""

        n, new = self.settings.n, self.settings.max_new_tokens
        return [(batch_bucket(len(b) * n) if self.cuda_graphs else len(b) * n,
                 length_bucket(max(self.cost(requests[i], image_sizes) for i in b) + new)) for b in planned if b]

    def forget_shapes(self) -> None:
        """Release every built decode shape (later batches build them again)."""
        for state in self._static.values():
            state.release()
        self._static.clear()
        free_device_cache()

    def shape_key(self, shape: tuple[int, int]) -> str | None:
        """The compile-cache key of a decode shape (batch, cache length) on this model and device."""
        if self.policy.cache is None:
            return None
        import torch

        name = torch.cuda.get_device_name(torch.device(self.device)) if self.on_cuda else "cpu"
        return self.policy.cache.key(self.loaded.model, self.loaded.runtime.dtype, shape[0], shape[1], name)
