"""The vision tower's MLP on rows a GPU's fast matrix kernels accept.

Qwen2.5-VL's vision MLP (every size, 3B to 72B) is 1280 → 3420 → 1280. A bf16 row of 3,420 values is
6,840 bytes: not a multiple of 16, which Hopper's fast kernels (TMA) need of every row of every operand.
So cuBLAS runs the gate, up and down products on its older kernels: on an H200, 32 images of 448 px spent
116 ms of a 289-ms vision tower in them (`cutlass_80_tensorop_..._align2`, ~230 TFLOP/s) where the
attention's products of the same tower ran on the Hopper kernels.

:func:`aligned_vision_mlps` pads the MLP once to a multiple of :data:`ALIGN` hidden units: gate and up
become one matrix of 2 × 3,456 rows (the extra rows zero), down a 1280 × 3,456 matrix (the extra columns
zero). The layers' parameters become views of them, so the state dict keeps its names, shapes and values,
and a checkpoint swapped in by ``copy_`` lands in the padded matrices. While :func:`use_aligned_vision_mlp`
is open (prefill) the MLP computes on the padded matrices: one product for gate and up, then down. The
extra units add exact zeros (silu(0) × 0, times zero weights); the sums themselves may come out of another
kernel in another order, as any change of kernel does. The engine applies it on CUDA devices.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn import functional

ALIGN = 64  # hidden units: rows of 128 bytes in bf16, which every kernel tile divides
MLP_CLASSES = frozenset({"Qwen2_5_VLMLP"})  # Qwen2.5-VL's vision blocks (its text MLP is another class)


class Aligned:
    """The padded matrices of one vision MLP; not a module (the layers' views are its parameters)."""

    def __init__(self, mlp):
        gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        units, self.padded = gate.out_features, -(-gate.out_features // ALIGN) * ALIGN
        with torch.inference_mode(False), torch.no_grad():  # normal tensors: the parameters' storage from now on
            self.gate_up = gate.weight.new_zeros(2 * self.padded, gate.in_features)
            self.gate_up[:units], self.gate_up[self.padded:self.padded + units] = gate.weight, up.weight
            self.gate_up_bias = None
            if gate.bias is not None:
                self.gate_up_bias = gate.bias.new_zeros(2 * self.padded)
                self.gate_up_bias[:units], self.gate_up_bias[self.padded:self.padded + units] = gate.bias, up.bias
            self.down = down.weight.new_zeros(down.out_features, self.padded)
            self.down[:, :units] = down.weight
            for linear, start in ((gate, 0), (up, self.padded)):
                linear.weight = torch.nn.Parameter(self.gate_up[start:start + units], requires_grad=False)
                if self.gate_up_bias is not None:
                    linear.bias = torch.nn.Parameter(self.gate_up_bias[start:start + units], requires_grad=False)
            down.weight = torch.nn.Parameter(self.down[:, :units], requires_grad=False)
        self.mlp = mlp

    def holds(self, mlp) -> bool:
        """Whether ``mlp``'s parameters are still the views of these matrices."""
        return (mlp.gate_proj.weight.data_ptr(), mlp.up_proj.weight.data_ptr(), mlp.down_proj.weight.data_ptr()) == (
            self.gate_up.data_ptr(), self.gate_up[self.padded:].data_ptr(), self.down.data_ptr())

    def forward(self, hidden_state: torch.Tensor) -> torch.Tensor:
        both = functional.linear(hidden_state, self.gate_up, self.gate_up_bias)
        gate, up = both[..., :self.padded], both[..., self.padded:]
        return functional.linear(self.mlp.act_fn(gate) * up, self.down, self.mlp.down_proj.bias)


def aligned_vision_mlps(model) -> list[Aligned]:
    """The padded form of every vision MLP of ``model`` whose hidden units are not a multiple of
    :data:`ALIGN` (made on the first call, kept on the module: later calls find it)."""
    found = []
    for module in model.modules():
        if type(module).__name__ not in MLP_CLASSES:
            continue
        aligned = vars(module).get("_vlmfast_aligned")
        if aligned is None or not aligned.holds(module):  # new, or its parameters replaced since (``.to()``)
            linears = (module.gate_proj, module.up_proj, module.down_proj)
            if (not all(type(m) is torch.nn.Linear for m in linears) or module.gate_proj.out_features % ALIGN == 0
                    or (module.gate_proj.bias is None) != (module.up_proj.bias is None)
                    or any(m.weight.device.type == "meta" for m in linears)):
                continue  # LoRA-wrapped, aligned already, biased unlike what Aligned makes, or offloaded by accelerate
            aligned = Aligned(module)
            object.__setattr__(module, "_vlmfast_aligned", aligned)  # not a submodule: no new state-dict keys
        found.append(aligned)
    return found


@contextlib.contextmanager
def use_aligned_vision_mlp(model, enabled: bool = True):
    """Within the block, the vision MLPs of ``model`` compute on padded matrices; yields how many. The engine
    enables it on CUDA devices (a CPU's kernels take any row length at the same speed)."""
    aligned = aligned_vision_mlps(model) if enabled else []
    for a in aligned:
        a.mlp.forward = a.forward
    try:
        yield len(aligned)
    finally:
        for a in aligned:
            del a.mlp.forward
