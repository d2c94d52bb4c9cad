"""The vision tower with every window (and image) of a layer in one attention call gives what the
per-window calls give, on the Qwen-VL towers transformers splits that way."""

import pytest

torch = pytest.importorskip("torch")

import vlmfast.vision_attention as va  # noqa: E402
from vlmfast.vision_attention import VARLEN_NAME, segment_attention, use_merged_vision_attention  # noqa: E402

# float32 on the CPU: the merged call reduces over padded rows with masked keys, the per-window calls
# over exact rows — the same sums in another order, so a few ulps apart.
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


def _counting(monkeypatch):
    calls = []
    original = va.segment_attention

    def spy(query, *args, **kwargs):
        calls.append(query.shape[2])
        return original(query, *args, **kwargs)

    monkeypatch.setattr(va, "segment_attention", spy)
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
    # 16×20 and 8×12 patches: windows of 4×4 merged tokens, the edge ones partial; plus a 2-frame video
    grid = torch.tensor([[1, 16, 20], [1, 8, 12], [2, 8, 8]])
    pixels = _patches(tower, grid)
    per_window = _forward(tower, pixels, grid)
    calls = _counting(monkeypatch)
    with use_merged_vision_attention(model) as merged:
        assert merged
        assert model.config.get_text_config()._attn_implementation == "sdpa"  # the language model is untouched
        got = _forward(tower, pixels, grid)
    torch.testing.assert_close(got, per_window, **TIGHT)
    assert calls == [int(grid.prod(-1).sum())] * len(tower.blocks)  # one call per layer, every patch in it
    assert {b.attn.config._attn_implementation for b in tower.blocks} == {"sdpa"}  # restored
    assert VARLEN_NAME not in ALL_ATTENTION_FUNCTIONS._local_mapping
    assert _forward(tower, pixels, grid).equal(per_window)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_full_attention_towers_merge_images(family, monkeypatch):
    tower = _tiny_tower(family)
    grid = torch.tensor([[1, 4, 6], [1, 8, 8], [2, 4, 4]])  # three images' worth of segments (the video: two)
    pixels = _patches(tower, grid)
    per_image = _forward(tower, pixels, grid)
    calls = _counting(monkeypatch)
    with use_merged_vision_attention(tower) as merged:
        got = _forward(tower, pixels, grid)
    assert merged and len(calls) == 2
    torch.testing.assert_close(got, per_image, **TIGHT)


def test_eager_and_unknown_models_are_left_alone(monkeypatch):
    tower = _tiny_tower("qwen2_vl", attn="eager")
    calls = _counting(monkeypatch)
    grid = torch.tensor([[1, 4, 4]])
    with use_merged_vision_attention(tower) as merged:
        _forward(tower, _patches(tower, grid), grid)
    assert not merged and calls == [] and tower.config._attn_implementation == "eager"
    with use_merged_vision_attention(torch.nn.Linear(2, 2)) as merged:
        assert not merged


def test_segment_attention_one_call_per_segment_above_the_budget():
    torch.manual_seed(1)
    lengths = [5, 1, 12, 7]
    cu = torch.tensor([0, 5, 6, 18, 25], dtype=torch.int32)
    q, k, v = (torch.randn(1, 3, sum(lengths), 8) for _ in range(3))
    reference = torch.cat([
        torch.nn.functional.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b]).transpose(1, 2)
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())
    ], dim=1)
    merged = segment_attention(q, k, v, cu)  # 4 × 12² = 576 scores: one call
    split = segment_attention(q, k, v, cu, max_scores=575)  # one more than the budget: per segment
    assert merged.shape == (1, 25, 3, 8)
    torch.testing.assert_close(merged, reference, **TIGHT)
    torch.testing.assert_close(split, reference, rtol=0, atol=0)


def test_model_prefill_is_unchanged(loaded, images):
    """What the engine does: the whole model's forward on processed images inside the context."""
    from vlmfast.engine import Engine, GenerationSettings
    from vlmfast.inputs import Request

    engine = Engine(loaded, GenerationSettings(max_new_tokens=1))
    inputs = engine.preprocess([Request(str(p), (str(p),), "What is in this image?") for p in images[:3]])
    with torch.inference_mode():
        reference = loaded.model(**inputs).logits
        with use_merged_vision_attention(loaded.model) as merged:
            got = loaded.model(**inputs).logits
    assert merged
    torch.testing.assert_close(got, reference, **TIGHT)
