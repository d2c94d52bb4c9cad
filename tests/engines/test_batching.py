import pytest

from vlmfast.engines.batching import image_tokens, plan_batches, smart_resize


def padding_waste(costs, batches) -> float:
    """Share of prefill slots that are padding under a plan (0 = none)."""
    total = sum(len(b) * max(costs[i] for i in b) for b in batches if b)
    return 0.0 if total == 0 else 1.0 - sum(costs) / total


def test_plan_batches_sorts_by_cost_and_keeps_every_index_once():
    costs = [5, 100, 7, 100, 50, 6]
    batches = plan_batches(costs, 2)
    assert batches == [[1, 3], [4, 2], [5, 0]]
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert plan_batches(costs, 10) == [[1, 3, 4, 2, 5, 0]]
    with pytest.raises(ValueError):
        plan_batches(costs, 0)


def test_cost_sorting_reduces_padding():
    costs = [10, 200, 12, 190, 11, 210]
    naive = [[0, 1], [2, 3], [4, 5]]
    assert padding_waste(costs, plan_batches(costs, 2)) < padding_waste(costs, naive)


@pytest.mark.parametrize("h,w", [(56, 56), (84, 112), (1080, 1920), (30, 500), (4000, 3000), (29, 29)])
def test_smart_resize_matches_transformers(h, w):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as hf

    lo, hi = 56 * 56, 1280 * 28 * 28
    assert smart_resize(h, w, factor=28, min_pixels=lo, max_pixels=hi) == hf(h, w, factor=28, min_pixels=lo, max_pixels=hi)


def test_image_tokens_one_per_28px_block():
    assert image_tokens(448, 448, min_pixels=3136, max_pixels=1280 * 28 * 28) == 256
    assert image_tokens(56, 56, min_pixels=3136, max_pixels=1280 * 28 * 28) == 4


def test_max_tokens_bounds_padded_batch_size():
    costs = [100, 10, 90, 20, 30, 500]
    batches = plan_batches(costs, 8, max_tokens=200)
    assert batches == [[5], [0, 2], [4, 3, 1]]  # 500 alone; 2×100; 3×30
    assert all(len(b) * max(costs[i] for i in b) <= 200 for b in batches if len(b) > 1)
    assert plan_batches(costs, 2, max_tokens=10_000) == plan_batches(costs, 2)
