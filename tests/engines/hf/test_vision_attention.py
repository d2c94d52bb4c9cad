"""The vision tower with every window (and image) of a layer in one attention call gives what the
per-window calls give, on the Qwen-VL towers transformers splits that way."""

import itertools

import pytest

from conftest import model_inputs

torch = pytest.importorskip("torch")

from vlmfast.engines.hf.vision_attention import VARLEN_NAME, segment_attention, use_merged_vision_attention  # noqa: E402

# float32 on the CPU: the merged calls and transformers' per-window ones take each window at its own length,
# but the model around them (the tower's other operations on a batch of windows) may sum in another order.
TIGHT = dict(rtol=1e-5, atol=1e-6)


def _patches(tower, grid):
    config = tower.config
    torch.manual_seed(0)
    n = int(grid.prod(-1).sum())
    return torch.randn(n, config.in_channels * config.temporal_patch_size * config.patch_size ** 2)


def _forward(tower, pixels, grid):
    with torch.inference_mode():
        out = tower(pixels, grid_thw=grid)
    out = getattr(out, "pooler_output", out)  # 5.x returns an output object, 4.57 the merged tensor
    return out[0] if isinstance(out, tuple) else out


def _sdpa_calls(monkeypatch):
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(a[0].shape) or original(*a, **k))
    return calls


def _tiny_tower(family: str, attn: str = "sdpa"):
    """A two-layer random vision tower of Qwen2-VL or Qwen3-VL, built from its config."""
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel as Tower

        config = Qwen2VLConfig(vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2)).vision_config
    else:
        from transformers import Qwen3VLConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel as Tower

        config = Qwen3VLConfig(vision_config=dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=32,
                                                  deepstack_visual_indexes=[0], num_position_embeddings=64)).vision_config
    config._attn_implementation = attn
    torch.manual_seed(0)
    return Tower._from_config(config).eval()


def test_qwen2_5_vl_windows_merged_equal_per_window(loaded, monkeypatch):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = loaded.model
    tower = model.model.visual
    # two images and a 2-frame video; windows of 4×4 merged tokens (64 patches), 16×20 has short edge ones
    grid = torch.tensor([[1, 16, 20], [1, 16, 16], [2, 16, 16]])
    pixels = _patches(tower, grid)
    per_window = _forward(tower, pixels, grid)
    calls = _sdpa_calls(monkeypatch)
    with use_merged_vision_attention(model) as merged:
        assert merged
        assert model.config.get_text_config()._attn_implementation == "sdpa"  # the language model is untouched
        got = _forward(tower, pixels, grid)
    assert got.equal(per_window)  # bit for bit what transformers' per-window calls give
    heads, dim = tower.blocks[0].attn.num_heads, tower.blocks[0].attn.head_dim
    assert tower.fullatt_block_indexes == [1]
    # one call per length and layer: the 2 short edge windows (32 patches) and 16 full ones (64); then the 3
    # frames of 256 patches and the 320-patch image
    assert calls == [(2, heads, 32, dim), (16, heads, 64, dim), (3, heads, 256, dim), (1, heads, 320, dim)]
    assert {b.attn.config._attn_implementation for b in tower.blocks} == {"sdpa"}  # restored
    assert VARLEN_NAME not in ALL_ATTENTION_FUNCTIONS._local_mapping
    assert _forward(tower, pixels, grid).equal(per_window)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_full_attention_towers_merge_images(family, monkeypatch):
    tower = _tiny_tower(family)
    grid = torch.tensor([[1, 8, 8], [1, 6, 8], [2, 8, 6]])  # 64, 48 patches and a 2-frame video of 48 per frame
    pixels = _patches(tower, grid)
    per_image = _forward(tower, pixels, grid)
    calls = _sdpa_calls(monkeypatch)
    with use_merged_vision_attention(tower) as merged:
        got = _forward(tower, pixels, grid)
    # each layer: one call per length — the 3 segments of 48 patches, the image of 64 — each at its own length
    assert merged and [tuple(c)[:3:2] for c in calls] == [(3, 48), (1, 64)] * 2
    assert got.equal(per_image)  # bit for bit what transformers' per-image calls give


def test_eager_and_unknown_models_are_left_alone(monkeypatch):
    tower = _tiny_tower("qwen2_vl", attn="eager")
    grid = torch.tensor([[1, 4, 4], [1, 4, 4]])
    pixels = _patches(tower, grid)
    calls = _sdpa_calls(monkeypatch)
    with use_merged_vision_attention(tower) as merged:
        _forward(tower, pixels, grid)
    assert not merged and calls == [] and tower.config._attn_implementation == "eager"  # eager: no SDPA at all
    with use_merged_vision_attention(torch.nn.Linear(2, 2)) as merged:
        assert not merged


def _packed(lengths):
    torch.manual_seed(1)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    q, k, v = (torch.randn(1, 3, sum(lengths), 8) for _ in range(3))
    reference = torch.cat([
        torch.nn.functional.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]).transpose(1, 2)
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())
    ], dim=1)
    return (q, k, v, cu), reference


def test_segments_of_several_lengths_run_one_call_per_length_each_exactly(monkeypatch):
    args, reference = _packed([9, 12, 10, 12, 9, 11])
    calls = _sdpa_calls(monkeypatch)
    got = segment_attention(*args)
    assert got.shape == (1, 63, 3, 8) and sorted(map(tuple, calls)) == [(1, 3, 10, 8), (1, 3, 11, 8), (2, 3, 9, 8), (2, 3, 12, 8)]
    torch.testing.assert_close(got, reference, rtol=0, atol=0)  # each segment's own sums: no padding, no mask
    calls.clear()
    split = segment_attention(*args, max_scores=143)  # 12² = 144 scores over the budget: the 12s one call each
    assert sorted(map(tuple, calls)) == [(1, 3, 9, 8), (1, 3, 9, 8), (1, 3, 10, 8), (1, 3, 11, 8), (1, 3, 12, 8), (1, 3, 12, 8)]
    torch.testing.assert_close(split, reference, rtol=0, atol=0)


def test_a_segment_gives_the_same_bits_whatever_segments_share_the_call():
    """An image's vision features do not depend on the other images of its prefill group: padded to the longest
    image with a key mask they did, in their last bits, and a tied greedy token flipped with the batch."""
    (q, k, v, _), _ = _packed([10])
    alone = segment_attention(q, k, v, torch.tensor([0, 10], dtype=torch.int32))
    for others in ([12, 7], [30], [10, 3, 10]):
        (q2, k2, v2, _), _ = _packed(others)
        packed = [torch.cat([t, u], dim=2) for t, u in ((q, q2), (k, k2), (v, v2))]
        cu = torch.tensor([0, *itertools.accumulate([10, *others])], dtype=torch.int32)
        torch.testing.assert_close(segment_attention(*packed, cu)[:, :10], alone, rtol=0, atol=0)


def test_segments_of_one_length_are_a_view_without_a_mask(monkeypatch):
    """Images of one size: every window (and image) the same length, so the packed tensors are the batch
    already — one call, no padding, no mask (SDPA may take its flash kernel), each segment's exact sums."""
    args, reference = _packed([16, 16, 16, 16])
    seen = []
    original = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: seen.append((a[0].shape, k.get("attn_mask"))) or original(*a, **k))
    got = segment_attention(*args)
    assert seen == [((4, 3, 16, 8), None)]
    torch.testing.assert_close(got, reference, rtol=0, atol=0)


def test_model_prefill_is_unchanged(loaded, images):
    """What the engine does: the whole model's forward on processed images inside the context."""
    from vlmfast.engines.hf.engine import Engine, GenerationSettings
    from vlmfast.inputs.requests import Request

    engine = Engine(loaded, GenerationSettings(max_new_tokens=1))
    inputs = model_inputs(engine, [Request(str(p), (str(p),), "What is in this image?") for p in images[:3]])
    with torch.inference_mode():
        reference = loaded.model(**inputs).logits
        with use_merged_vision_attention(loaded.model) as merged:
            got = loaded.model(**inputs).logits
    assert merged
    torch.testing.assert_close(got, reference, **TIGHT)
