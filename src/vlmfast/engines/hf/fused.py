"""Fused projections in the decode step: Q, K and V in one matrix multiply, gate and up in another.

A decode step is a chain of small matrix multiplies (batch rows × one token); each costs a kernel launch
and a pass over the input, so three projections of the same hidden state cost three of each where one
would do. :func:`fuse_projections` concatenates, once, the weights of every group of linear layers that
read one input (:data:`GROUPS`) into one matrix each: an attention module's ``q_proj``/``k_proj``/``v_proj``,
a dense MLP's ``gate_proj``/``up_proj``, a Gated DeltaNet's four input projections (Qwen3.5: Q/K/V, the
output gate ``z``, and the one-column-per-head ``b`` and ``a``), an MoE block's shared expert gate/up with
the shared expert's one-column gate.
The original parameters become views of it — the model's state dict keeps its names, shapes and values,
and a checkpoint swapped in by ``copy_`` lands in the fused matrix too — and the modules become
:class:`Part` s: while :func:`fused_projections` is active (the decode step) the first part called on an
input computes the whole product and the others take their slice of it; otherwise each part computes its
own slice as before (prefill and ``generate`` keep their numerics). LoRA-wrapped or mixed-dtype layers,
the routed MoE experts and the router are left as they are. CUDA graphs hold the fused products, and a
compiled step traces them (dynamo follows the parts' shared state): one library product per group in
inductor's code, where the unfused step had one per layer of the group.

On a CPU (float32, room for a second copy of the weights) every decode product also runs on a *packed*
weight (:class:`Packed`), as vLLM's CPU backend and inductor's CPU freezing do: MKL's packed GEMM for
weights of up to a million elements (where one pack serves any row count), oneDNN's blocked layout for
larger ones (:func:`layout_of` has the figures). The plain ``linear`` (MKL) gives a row other bits when the
batch has other rows; a packed product gives a row the same bits for any number of rows above one, and a
single row is computed as two (alone it takes another kernel, whose sums differ: MKL's at 64 inputs,
oneDNN's from 2,048 on) — what makes batch 1 and batch N choose the same tokens. At 2,048 × 2,048 and 8
rows oneDNN's packed product takes 554 µs against plain ``linear``'s 1,029 on 2 cores. Then ``o_proj``,
``down_proj`` and the LM head are groups of one (no copy: the group's matrix is the layer's own weight). A
packed weight is a copy: it is made again when its source changed in place (a checkpoint swap), which its
version counter shows.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
from torch.nn import functional

# (a decoder layer's module, the linear layers under it that read one input): the names a family lacks are skipped
GROUPS = (
    ("self_attn", ("q_proj", "k_proj", "v_proj")),
    ("mlp", ("gate_proj", "up_proj")),
    ("linear_attn", ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")),  # Qwen3.5's Gated DeltaNet
    ("mlp", ("shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert_gate")),  # Qwen3.5-MoE's shared expert
)
# groups of one: worth making only for a packed product
ALONE = (("self_attn", ("o_proj",)), ("mlp", ("down_proj",)), ("linear_attn", ("out_proj",)),
         ("mlp", ("shared_expert.down_proj",)))
PACKED_SHARE = 0.25  # pack only when the packed copies take at most this share of the available memory
MKL_MOST = 1 << 20  # weights up to this many elements pack for MKL; larger ones for oneDNN (see layout_of)


class Packed:
    """A CPU float32 weight in a packed layout (:func:`layout_of`: MKL's or oneDNN's), made again whenever
    its source changes in place."""

    def __init__(self, source: torch.Tensor, layout: str | None = None):
        self.source = source
        self.version = -1
        self.blocked = None  # made by the first refresh (a decode step's), so an unused one costs nothing
        self.mkl = (layout or layout_of(source)) == "MKL"

    def refresh(self) -> None:
        if self.version != self.source._version:
            with torch.no_grad():
                self.blocked = (torch.ops.mkl._mkl_reorder_linear_weight(self.source, 2) if self.mkl
                                else torch.ops.mkldnn._reorder_linear_weight(self.source))
            self.version = self.source._version

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.blocked is None:
            self.refresh()
        rows = x.numel() // x.shape[-1]
        if rows == 1:  # alone, one row takes another kernel, whose sums differ: computed as two
            return self(torch.cat([x, x]), bias)[:1]
        if self.mkl:  # one pack serves every row count (checked by mkl_serves_any_rows)
            return torch.ops.mkl._mkl_linear(x.contiguous(), self.blocked, self.source, bias, rows)
        return torch.ops.mkldnn._linear_pointwise(x, self.blocked, bias, "none", [], "")


def layout_of(weight: torch.Tensor) -> str:
    """The packed layout for a weight: MKL's for weights of up to :data:`MKL_MOST` elements where one MKL pack
    serves every row count, else oneDNN's (where this torch has it). Measured on 2 cores (µs per call at 1 / 8
    / 32 rows): 128 × 64, MKL 8.8 / 5.6 / 8.1 against oneDNN 23.9 / 19.2 / 22.2; 1,024 × 1,024, 69 / 77 / 267
    against 95 / 120 / 287; 2,048 × 2,048, 379 / 454 / 1,616 against 415 / 542 / 1,118 — a pack made for 2 rows
    slows down at many rows of a large weight. A one-output weight is oneDNN's: MKL gives its rows other bits
    from 4 rows on (measured; none is packed alone today)."""
    if mkl_serves_any_rows() and weight.shape[0] > 1 and (weight.numel() <= MKL_MOST or not onednn_packs()):
        return "MKL"
    return "oneDNN"


def onednn_packs() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


@functools.cache
def mkl_serves_any_rows() -> bool:
    """Whether one MKL pack of a weight serves products of any row count. MKL's API packs a weight for a row
    count; checked here on a narrow and a 2,048-wide shape: a pack made for 2 rows takes as many bytes as
    one made for 64, and serves 2 to 33 rows with ``linear``'s values (to rounding) and a row's bits
    whatever rows share the product (:func:`row_invariant` checks that too)."""
    mkl = getattr(torch.ops.mkl, "_mkl_linear", None)
    if mkl is None or not torch.backends.mkl.is_available():
        return False
    reorder = torch.ops.mkl._mkl_reorder_linear_weight
    try:
        with torch.inference_mode(False), torch.no_grad():
            g = torch.Generator().manual_seed(0)
            for out_features, in_features in ((96, 64), (160, 2048)):
                weight, bias = torch.randn(out_features, in_features, generator=g), torch.randn(out_features, generator=g)
                x, pack = torch.randn(33, in_features, generator=g), reorder(weight, 2)
                if pack.shape != reorder(weight, 64).shape:
                    return False
                whole = mkl(x, pack, weight, bias, 33)
                for rows in (2, 3, 8, 13):
                    got = mkl(x[:rows], pack, weight, bias, rows)
                    if not (torch.equal(got, whole[:rows])
                            and torch.allclose(got, functional.linear(x[:rows], weight, bias), rtol=1e-4, atol=1e-3)):
                        return False
    except RuntimeError:
        return False
    return True


def packing_plan(weights: list[torch.Tensor], matrices: list[torch.Tensor] | None = None) -> tuple[bool, str]:
    """Whether to pack a model's decode weights — on a CPU, in float32, where MKL or oneDNN packs and the
    copies fit easily in memory — and what to say of it ("" where packing never applies: a GPU, another dtype).
    ``matrices``: the matrices that will be packed (:func:`decode_matrices`: fused groups, not the layers' own
    weights), whose sizes choose the layouts; the weights themselves where not given."""
    if not weights or any(w.device.type != "cpu" or w.dtype != torch.float32 or w.is_inference() for w in weights):
        return False, ""  # (an inference tensor keeps no version counter: a change to it could not be seen)
    weights = list({id(w): w for w in weights}.values())
    layouts = {layout_of(m) for m in (weights if matrices is None else matrices)}
    if "oneDNN" in layouts and not onednn_packs():
        return False, "CPU decode products unpacked: this torch has neither oneDNN nor MKL's packed GEMM"
    for layout in layouts:  # builds differ by CPU (x86, Arm): one small product says whether this one packs
        try:
            with torch.inference_mode(False):
                Packed(torch.ones(8, 8), layout)(torch.ones(2, 8), None)
        except RuntimeError as exc:
            return False, f"CPU decode products unpacked: {layout} could not pack here ({str(exc).splitlines()[0][:120]})"
    needed = sum(w.numel() * w.element_size() for w in weights)
    available = available_memory()
    if needed > PACKED_SHARE * available:
        return False, (f"CPU decode products unpacked: packed copies of the weights would take {needed / 2**30:.1f} GiB, "
                       f"more than {PACKED_SHARE:.0%} of the {available / 2**30:.1f} GiB available")
    varies = "" if all(row_invariant(layout) for layout in layouts) else (
        "; on this torch a product's row depends on how many rows share it, so batch 1 and batch N may choose "
        "other tokens where two logits nearly tie (torch 2.14 packs row-invariantly)")
    said = ("MKL- and oneDNN-packed weights, MKL's up to 2^20 elements" if len(layouts) == 2
            else f"{next(iter(layouts))}-packed weights")
    return True, f"CPU decode products on {said} ({needed / 2**30:.2f} GiB of copies){varies}"


@functools.cache
def row_invariant(layout: str) -> bool:
    """Whether a product packed in ``layout`` gives a row the same bits whatever rows share the product: what
    makes batch 1 and batch N decode the same tokens on a CPU. Measured on x86: torch 2.14.1 yes (a single
    row computed as two), 2.11.0's oneDNN no (nor its plain ``linear``, so packing costs nothing there)."""
    with torch.inference_mode(False):
        g = torch.Generator().manual_seed(0)
        for shape in ((192, 64), (160, 2048)):
            weight, x = torch.randn(*shape, generator=g), torch.randn(32, shape[1], generator=g)
            packed = Packed(weight, layout)
            alone = {row: packed(x[row:row + 1], None) for row in (0, 5)}
            if not all(torch.equal(packed(x[:rows], None)[row:row + 1], alone[row])
                       for rows in (2, 13, 32) for row in alone if row < rows):
                return False
        return True


def available_memory() -> int:
    """Bytes of memory available to a new allocation (Linux: MemAvailable; elsewhere the free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def decode_weights(layers, lm_head) -> list[torch.Tensor]:
    """The weights a decode step's products read: the decoder layers' plain (or fused) linear layers and the
    head; none when the head is not a plain linear layer (nothing is packed then)."""
    if type(lm_head) is not torch.nn.Linear:
        return []
    return [m.weight for m in layers.modules() if type(m) is torch.nn.Linear or isinstance(m, Part)] + [lm_head.weight]


class Fused:
    """One matrix for several linear layers that read the same input; not a module (its weight is reached
    through the parts' views, so the model's state dict is unchanged). A group of one keeps the layer's own
    weight (nothing to concatenate)."""

    def __init__(self, linears: list[torch.nn.Linear], *, pack: bool = False):
        # a normal tensor even when made in inference mode: it is the parameters' storage from now on, and
        # its version counter says when a swap changed it
        with torch.inference_mode(False), torch.no_grad():
            if len(linears) == 1:
                self.weight, self.bias = linears[0].weight, linears[0].bias
            else:
                self.weight = torch.cat([linear.weight for linear in linears])
                self.bias = torch.cat([linear.bias for linear in linears]) if linears[0].bias is not None else None
        self.bounds, start = [], 0
        for linear in linears:
            self.bounds.append((start, start + linear.out_features))
            start += linear.out_features
        self.packed = Packed(self.weight) if pack else None
        self.active = False
        self._input = self._output = None
        self._left = 0

    def product(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and not torch.compiler.is_compiling():  # a compiled step: inductor's products
            return self.packed(x, self.bias)
        return functional.linear(x, self.weight, self.bias)

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Part ``index`` of the fused product of ``x``: computed once per input, then sliced."""
        if x is not self._input:
            self._input, self._output, self._left = x, self.product(x), len(self.bounds)
        start, end = self.bounds[index]
        out = self._output[..., start:end] if len(self.bounds) > 1 else self._output
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
        if len(fused.bounds) == 1:  # a group of one: the layer's own parameters
            self.weight, self.bias = linear.weight, linear.bias
        else:
            self.weight = torch.nn.Parameter(fused.weight[start:end], requires_grad=False)
            self.bias = None if fused.bias is None else torch.nn.Parameter(fused.bias[start:end], requires_grad=False)
        object.__setattr__(self, "fused", fused)  # not a submodule: the state dict holds only the views
        self.index = index

    def forward(self, x):
        if self.fused.active:
            return self.fused.part(x, self.index)
        return functional.linear(x, self.weight, self.bias)


def _resolve(owner, name: str):
    """(the module holding ``name``'s last part, that part, the module it names) under ``owner``; Nones where
    the path is missing."""
    *path, last = name.split(".")
    for step in path:
        owner = getattr(owner, step, None)
    return owner, last, getattr(owner, last, None) if owner is not None else None


def _groups(layers, pack: bool):
    """Per decoder layer, each projection group :func:`fuse_projections` takes: (the places of its layers, the
    layers, the group fused before by another engine or None)."""
    for layer in layers:
        for owner_name, names in GROUPS + (ALONE if pack else ()):
            owner = getattr(layer, owner_name, None)
            if owner is None:
                continue
            places = [_resolve(owner, name) for name in names]
            linears = [module for _, _, module in places]
            if all(isinstance(m, Part) for m in linears) and len({id(m.fused) for m in linears}) == 1:
                yield places, linears, linears[0].fused  # fused by an earlier engine on this model: the same group
                continue
            if not all(type(m) is torch.nn.Linear for m in linears):
                continue
            if len({(m.weight.dtype, m.weight.device, m.in_features, m.bias is None) for m in linears}) != 1:
                continue
            yield places, linears, None


def decode_matrices(layers, lm_head) -> list[torch.Tensor]:
    """The matrices a packed decode step packs (as shapes only, on the meta device): each group of
    :func:`fuse_projections` with ``pack``, concatenated, and the head — what :func:`layout_of` decides on."""
    if type(lm_head) is not torch.nn.Linear:
        return []
    shapes = [group.weight.shape if group is not None else (sum(m.out_features for m in linears), linears[0].in_features)
              for _, linears, group in _groups(layers, pack=True)]
    return [torch.empty(shape, device="meta") for shape in shapes + [lm_head.weight.shape]]


def fuse_projections(layers, *, pack: bool = False) -> list[Fused]:
    """Fuse the projection groups of every decoder layer of ``layers`` that has them as plain linear layers of
    one dtype and device; returns the fused matrices (for :func:`fused_projections`), those fused before (by
    another engine on the same model) included. With ``pack`` every group's product runs on a packed weight,
    and the output projections (``o_proj``, ``down_proj``, ``out_proj``) become groups of one."""
    fused = []
    for places, linears, group in _groups(layers, pack):
        if group is not None:
            if pack and group.packed is None:
                group.packed = Packed(group.weight)
            fused.append(group)
            continue
        group = Fused(linears, pack=pack)
        for index, ((parent, attr, _), linear) in enumerate(zip(places, linears)):
            setattr(parent, attr, Part(group, index, linear))
        fused.append(group)
    return fused


@contextlib.contextmanager
def fused_projections(groups: list[Fused]):
    """Within the block (a decode step), the fused groups compute one product per input (packed weights made
    again first where their source changed)."""
    if not groups:
        yield
        return
    for group in groups:
        group.active = True
        if group.packed is not None:
            group.packed.refresh()
    try:
        yield
    finally:
        for group in groups:
            group.active, group._input, group._output = False, None, None

