"""Fused projections in the decode step: Q, K and V in one matrix multiply, gate and up in another.

A decode step is a chain of small matrix multiplies (batch rows × one token); each costs a kernel launch
and a pass over the input, so three projections of the same hidden state cost three of each where one
would do. :func:`fuse_projections` concatenates, once, the weights of every attention module's
``q_proj``/``k_proj``/``v_proj`` and every dense MLP's ``gate_proj``/``up_proj`` into one matrix each.
The original parameters become views of it — the model's state dict keeps its names, shapes and values,
and a checkpoint swapped in by ``copy_`` lands in the fused matrix too — and the modules become
:class:`Part` s: while :func:`fused_projections` is active (the decode step) the first part called on an
input computes the whole product and the others take their slice of it; otherwise each part computes its
own slice as before (prefill and ``generate`` keep their numerics). LoRA-wrapped or mixed-dtype layers,
MoE experts and linear-attention layers are left as they are. A compiled step is not fused (dynamo would
trace the parts' shared state); CUDA graphs are.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn import functional

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class Fused:
    """One matrix for several linear layers that read the same input; not a module (its weight is reached
    through the parts' views, so the model's state dict is unchanged)."""

    def __init__(self, linears: list[torch.nn.Linear]):
        with torch.no_grad():
            self.weight = torch.cat([linear.weight for linear in linears])
            self.bias = torch.cat([linear.bias for linear in linears]) if linears[0].bias is not None else None
        self.bounds, start = [], 0
        for linear in linears:
            self.bounds.append((start, start + linear.out_features))
            start += linear.out_features
        self.active = False
        self._input = self._output = None
        self._left = 0

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Part ``index`` of the fused product of ``x``: computed once per input, then sliced."""
        if x is not self._input:
            self._input, self._output, self._left = x, functional.linear(x, self.weight, self.bias), len(self.bounds)
        start, end = self.bounds[index]
        out = self._output[..., start:end]
        self._left -= 1
        if self._left == 0:  # every part served: hold no activation between layers or steps
            self._input = self._output = None
        return out


class Part(torch.nn.Module):
    """One of the fused layers: its weight (and bias) a view of the fused matrix."""

    def __init__(self, fused: Fused, index: int, linear: torch.nn.Linear):
        super().__init__()
        start, end = fused.bounds[index]
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = torch.nn.Parameter(fused.weight[start:end], requires_grad=False)
        self.bias = None if fused.bias is None else torch.nn.Parameter(fused.bias[start:end], requires_grad=False)
        object.__setattr__(self, "fused", fused)  # not a submodule: the state dict holds only the views
        self.index = index

    def forward(self, x):
        if self.fused.active:
            return self.fused.part(x, self.index)
        return functional.linear(x, self.weight, self.bias)


def fuse_projections(layers) -> list[Fused]:
    """Fuse the projection groups of every decoder layer of ``layers`` that has them as plain linear layers of
    one dtype and device; returns the fused matrices (for :func:`fused_projections`), those fused before (by
    another engine on the same model) included."""
    fused = []
    for layer in layers:
        for owner in (getattr(layer, "self_attn", None), getattr(layer, "mlp", None)):
            for names in GROUPS:
                linears = [getattr(owner, name, None) for name in names] if owner is not None else []
                if linears and all(isinstance(m, Part) for m in linears) and len({id(m.fused) for m in linears}) == 1:
                    fused.append(linears[0].fused)  # fused by an earlier engine on this model: the same group
                    continue
                if not linears or not all(type(m) is torch.nn.Linear for m in linears):
                    continue
                if len({(m.weight.dtype, m.weight.device, m.in_features, m.bias is None) for m in linears}) != 1:
                    continue
                group = Fused(linears)
                for index, (name, linear) in enumerate(zip(names, linears)):
                    setattr(owner, name, Part(group, index, linear))
                fused.append(group)
    return fused


@contextlib.contextmanager
def fused_projections(groups: list[Fused], enabled: bool = True):
    """Within the block (a decode step), the fused groups compute one product per input."""
    if not enabled or not groups:
        yield
        return
    for group in groups:
        group.active = True
    try:
        yield
    finally:
        for group in groups:
            group.active, group._input, group._output = False, None, None
