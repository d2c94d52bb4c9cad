import pytest

from vlmfast.capacity import (
    ModelShape, auto_batch_size, bandwidth_report, decode_bytes_per_step, peak_bandwidth_gbps, shape_from_model,
)

# Qwen2.5-VL-3B-Instruct's language model in bf16: 36 layers, 2 KV heads of 128, ~3.085B parameters.
QWEN_3B = ModelShape(layers=36, kv_heads=2, head_dim=128, hidden_size=2048, vocab_size=151936,
                     lm_params=3_085_000_000, dtype_bytes=2)


def test_kv_and_weight_bytes_of_a_known_config():
    assert QWEN_3B.kv_bytes_per_token == 36 * 2 * 128 * 2 * 2 == 36_864
    assert QWEN_3B.lm_weight_bytes == 6_170_000_000  # Qwen2.5-VL-3B: ~6.17 GB of language-model weights read per decode step
    assert decode_bytes_per_step(QWEN_3B, 8, 1000) == 6_170_000_000 + 8 * 1000 * 36_864


def test_bandwidth_against_the_h100_floor():
    # 1.84 ms per step at batch 1 with a short context is the H100's bandwidth floor (3.35 TB/s)
    r = bandwidth_report(QWEN_3B, 1, 0, 0.00184, "NVIDIA H100 80GB HBM3")
    assert r["peak_gb_per_s"] == 3350.0
    assert r["decode_gb_per_s"] == pytest.approx(3353.3, abs=0.1)
    assert r["bandwidth_pct_of_peak"] == pytest.approx(100.1, abs=0.1)
    slow = bandwidth_report(QWEN_3B, 1, 0, 0.0184, "NVIDIA H100 80GB HBM3")
    assert slow["bandwidth_pct_of_peak"] == pytest.approx(10.0, abs=0.1)
    assert bandwidth_report(QWEN_3B, 1, 0, 0.01, "cpu")["bandwidth_pct_of_peak"] is None
    assert peak_bandwidth_gbps("NVIDIA H100 PCIe") == 2000.0 and peak_bandwidth_gbps("NVIDIA H200") == 4800.0
    assert peak_bandwidth_gbps("NVIDIA A100-SXM4-80GB") == 2039.0 and peak_bandwidth_gbps("Mystery GPU") is None


def test_auto_batch_size_from_free_memory():
    gib = 2**30
    # 2048-token contexts: 2048 × 36 KiB = 72 MiB KV per sample (+ logits)
    assert auto_batch_size(QWEN_3B, 60 * gib, 2048) == 64  # capped
    assert auto_batch_size(QWEN_3B, 4 * gib, 2048) == 47  # 0.85 × 4 GiB ÷ (72 MiB + 1.2 MB logits)
    assert auto_batch_size(QWEN_3B, 4 * gib, 2048, vision_bytes_per_sample=200 * 2**20) == 12
    assert auto_batch_size(QWEN_3B, 10 * 2**20, 2048) == 1  # never below one


def test_shape_from_a_real_model(loaded):
    shape = shape_from_model(loaded.model, "float32")
    text = loaded.model.config.get_text_config()
    assert (shape.layers, shape.kv_heads, shape.dtype_bytes) == (text.num_hidden_layers, text.num_key_value_heads, 4)
    vision = sum(p.numel() for p in loaded.model.model.visual.parameters())
    embed = loaded.model.get_input_embeddings().weight.numel()  # the tiny model's embeddings are untied
    assert shape.lm_params == sum(p.numel() for p in loaded.model.parameters()) - vision - embed > 0
    assert peak_bandwidth_gbps("NVIDIA GH200 480GB") == 4000.0
