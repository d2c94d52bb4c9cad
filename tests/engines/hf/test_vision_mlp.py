"""Qwen2.5-VL's vision MLP padded to rows the GPU's fast kernels accept gives what the MLP gives, keeps the
state dict as it was, and takes a checkpoint swapped in by ``copy_``."""

import pytest

torch = pytest.importorskip("torch")

from vlmfast.engines.hf.vision_mlp import ALIGN, aligned_vision_mlps, use_aligned_vision_mlp  # noqa: E402

TIGHT = dict(rtol=1e-5, atol=1e-6)  # float32 on the CPU: the same sums, perhaps by another kernel


def _tower(units: int, seed: int = 0):
    """A two-layer random Qwen2.5-VL vision tower whose MLP has ``units`` hidden units (3420 in the real ones)."""
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as Tower

    config = Qwen2_5_VLConfig(vision_config=dict(depth=2, hidden_size=32, intermediate_size=units, num_heads=2,
                                                 out_hidden_size=32, fullatt_block_indexes=[1])).vision_config
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    tower = Tower._from_config(config).eval()
    with torch.no_grad():  # biases are zero at initialization: make them count
        for block in tower.blocks:
            for linear in (block.mlp.gate_proj, block.mlp.up_proj, block.mlp.down_proj):
                linear.bias.normal_()
    return tower


def _forward(tower):
    grid = torch.tensor([[1, 8, 8], [1, 8, 12]])
    torch.manual_seed(1)
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 14 * 14)
    with torch.inference_mode():
        out = tower(pixels, grid_thw=grid)
    out = getattr(out, "pooler_output", out)  # 5.x returns an output object, 4.57 the merged tensor
    return out[0] if isinstance(out, tuple) else out


def test_padded_mlp_gives_the_mlp_output_and_keeps_the_state_dict():
    tower = _tower(36)
    before = {k: v.clone() for k, v in tower.state_dict().items()}
    reference = _forward(tower)
    with use_aligned_vision_mlp(tower) as count:
        got = _forward(tower)
    assert count == 2
    torch.testing.assert_close(got, reference, **TIGHT)
    mlp = tower.blocks[0].mlp
    aligned = aligned_vision_mlps(tower)[0]
    assert aligned.gate_up.shape == (2 * ALIGN, 32) and aligned.down.shape == (32, ALIGN)  # 36 units → 64
    assert aligned.gate_up[36:ALIGN].count_nonzero() == 0 and aligned.down[:, 36:].count_nonzero() == 0
    after = tower.state_dict()
    assert list(after) == list(before)  # no new keys, the same shapes and values
    assert all(after[k].shape == v.shape and after[k].equal(v) for k, v in before.items())
    assert mlp.up_proj.weight.data_ptr() == aligned.gate_up[ALIGN:].data_ptr()  # the parameters are views
    assert "forward" not in vars(mlp)  # the module computes as before outside the block
    torch.testing.assert_close(_forward(tower), reference, **TIGHT)


def test_a_swapped_checkpoint_lands_in_the_padded_matrices():
    tower, other = _tower(36), _tower(36, seed=5)
    with use_aligned_vision_mlp(tower):
        _forward(tower)  # padded on first use
    state = tower.state_dict()
    with torch.no_grad():
        for name, value in other.state_dict().items():  # what a sweep's swap does
            state[name].copy_(value)
    with use_aligned_vision_mlp(tower) as count:
        got = _forward(tower)
    assert count == 2  # found again, not padded twice
    torch.testing.assert_close(got, _forward(other), **TIGHT)


def test_parameters_replaced_after_padding_are_padded_again():
    """A ``.to()`` (or any new parameter) leaves the padded matrices behind: the next block pads anew."""
    tower = _tower(36)
    with use_aligned_vision_mlp(tower):
        _forward(tower)
    first = aligned_vision_mlps(tower)[0]
    tower.to(torch.float64)  # new tensors: the views are gone
    reference = _forward(tower)
    with use_aligned_vision_mlp(tower) as count:
        got = _forward(tower)
    again = aligned_vision_mlps(tower)[0]
    assert count == 2 and again is not first and again.gate_up.dtype == torch.float64
    torch.testing.assert_close(got, reference, rtol=1e-12, atol=1e-12)


def test_aligned_or_disabled_mlps_are_left_alone():
    tower = _tower(ALIGN)
    with use_aligned_vision_mlp(tower) as count:
        _forward(tower)
    assert count == 0 and aligned_vision_mlps(tower) == []
    odd = _tower(36)
    with use_aligned_vision_mlp(odd, enabled=False) as count:  # the engine's choice on a CPU
        _forward(odd)
    assert count == 0 and not hasattr(odd.blocks[0].mlp, "_vlmfast_aligned")
    offloaded = _tower(36).to("meta")  # accelerate's offload keeps weights on the meta device between calls
    with use_aligned_vision_mlp(offloaded) as count:
        pass
    assert count == 0
