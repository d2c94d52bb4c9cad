"""What the compiled decode step is made of: graph breaks, and the kernels inductor generates per layer.

A GPU decode step of a 3B model spends more time launching small kernels (norms, rotary positions,
casts, cache writes, adds) than reading weights: every kernel costs a few microseconds whatever it
computes. ``torch.compile`` fuses them, but only inside one graph — a graph break splits the step and
runs what lies between in Python. So two numbers say whether the step is as few kernels as the model
allows, and both can be read on any machine, a CPU included:

- **graph breaks** of the compiled step (``torch._dynamo.explain``): 0 for every family;
- **kernels per layer**: inductor's generated code for the step, its kernel calls counted, measured as
  the growth from the model to the same model with more layers (what one layer adds, without the
  embedding, the final norm, the head and the mask). *Generated* kernels are inductor's own fused
  kernels (C++ on a CPU, Triton on a GPU); *library* calls are the matrix products and attention it
  hands to a library. On a CPU the generated count is a proxy of the GPU's: the same fusion decisions,
  another code generator.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

# a kernel call in inductor's generated wrapper: its own kernels (C++ / Triton) and library calls
GENERATED = re.compile(r"^\s+(?:\w+ = )?(cpp_fused_\w+|triton_\w+\.run)\(", re.M)
LIBRARY = re.compile(r"^\s+(?:\w+ = )?(extern_kernels\.\w+|torch\.ops\.[\w.]+)\(", re.M)


@dataclass(frozen=True)
class StepKernels:
    layers: int
    graph_breaks: int
    generated: int  # inductor's kernels launched per step
    library: int  # matrix products, attention and other library calls per step


@dataclass(frozen=True)
class PerLayer:
    family: str
    graph_breaks: int
    generated: float  # what one more layer adds to the step
    library: float
    counts: tuple[StepKernels, StepKernels]

    def line(self) -> str:
        return (f"{self.family}: {self.graph_breaks} graph breaks; per layer {self.generated:g} generated kernels + "
                f"{self.library:g} library calls (steps of {self.counts[0].layers} and {self.counts[1].layers} layers)")


def count_kernels(code: list[str]) -> tuple[int, int]:
    """(generated kernels, library calls) launched by the ``call`` functions of inductor's output code."""
    calls = [c.split("def call(", 1)[-1] for c in code]
    return sum(len(GENERATED.findall(c)) for c in calls), sum(len(LIBRARY.findall(c)) for c in calls)


@contextlib.contextmanager
def _decode_step(model, layers: int, rows: int, length: int, temperature: float = 0.0, top_p: float = 1.0,
                 penalty: float = 1.0):
    """A static decode state over ``model``'s first ``layers`` decoder layers, inside the context its step
    runs in (:meth:`DecodeState.step_context`); the model's layers are restored afterwards."""
    import torch

    from vlmfast.engines.hf.decode import DecodeState, forward_static
    from vlmfast.engines.hf.text_decoder import TextDecoder

    text = model.model.language_model
    kept = text.layers
    text.layers = torch.nn.ModuleList(list(kept)[:layers])
    try:
        decoder = TextDecoder(model)
        state = DecodeState(decoder, rows, length, 8, static=True, eos_ids=[], pad_id=0,
                            bias=torch.zeros(decoder.vocab, device=model.lm_head.weight.device),
                            temperature=temperature, top_p=top_p, forward=forward_static, penalty=penalty)
        state.cache.attend = length
        with torch.inference_mode(), state.step_context():
            torch._dynamo.reset()
            try:
                yield state
            finally:
                torch._dynamo.reset()
    finally:
        text.layers = kept


def graph_breaks(model, *, rows: int = 4, length: int = 256, temperature: float = 0.0, top_p: float = 1.0,
                 penalty: float = 1.0) -> int:
    """Graph breaks dynamo finds in the static decode step of ``model``, token choice included (greedy, or a
    draw at ``temperature`` with nucleus ``top_p``; under a repetition ``penalty``); traced, not compiled."""
    import torch

    from vlmfast.engines.hf.decode import step_static

    with _decode_step(model, len(model.model.language_model.layers), rows, length, temperature, top_p, penalty) as state:
        return torch._dynamo.explain(step_static)(state).graph_break_count


def step_kernels(model, layers: int, *, rows: int = 4, length: int = 256) -> StepKernels:
    """Compile the static decode step of ``model``'s first ``layers`` decoder layers, token choice included
    (a fresh compile, no cache), and count its graph breaks and kernel calls."""
    import torch
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    from vlmfast.engines.hf.decode import step_static

    with _decode_step(model, layers, rows, length) as state:
        breaks = torch._dynamo.explain(step_static)(state).graph_break_count
        torch._dynamo.reset()
        with inductor_config.patch(fx_graph_cache=False):
            _, code = run_and_get_code(torch.compile(step_static, dynamic=False), state)
    generated, library = count_kernels(code)
    return StepKernels(layers, breaks, generated, library)


def per_layer(model, family: str, *, period: int = 1, rows: int = 4, length: int = 256) -> PerLayer:
    """Kernels one decoder layer adds to the compiled step: counted over ``model``'s first ``period`` and
    first ``2 × period`` layers (``period``: a hybrid model's repeating pattern, Qwen3.5's three
    linear-attention layers and one full one), the difference divided by ``period``."""
    total = len(model.model.language_model.layers)
    if total < 2 * period:
        raise ValueError(f"{family} has {total} decoder layers: per-layer counts need {2 * period}")
    fewer, more = (step_kernels(model, n, rows=rows, length=length) for n in (period, 2 * period))
    return PerLayer(family, max(fewer.graph_breaks, more.graph_breaks), (more.generated - fewer.generated) / period,
                    (more.library - fewer.library) / period, (fewer, more))
