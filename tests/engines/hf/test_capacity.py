import pytest

from vlmfast.engines.bandwidth import (
    ModelShape, bandwidth_report, decode_bytes_per_step, peak_bandwidth_gbps, shape_from_model,
)
from vlmfast.engines.hf.capacity import (
    auto_batch_size, batch_memory,
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
    assert auto_batch_size(QWEN_3B, 4 * gib, 2048) == 47  # 0.85 × 4 GiB ÷ (72 MiB + 1.5 MB logits)
    assert auto_batch_size(QWEN_3B, 4 * gib, 2048, vision_bytes_per_sample=200 * 2**20) == 12
    assert auto_batch_size(QWEN_3B, 10 * 2**20, 2048) == 1  # never below one


# vlmfast's CUDA graph buckets and length multiple, written out: the figures below are computed by hand
BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
GIB = 2**30
ROW_2048 = 2048 * 36_864 + 151_936 * 10  # one row's KV cache at 2048 positions + 10 bytes of logits per entry = 77,016,832
PROMPT_1000 = 1000 * 36_864  # one row's prefill cache of a 1000-token prompt = 36,864,000


def test_batch_memory_parts_by_hand():
    m = batch_memory(QWEN_3B, 33, 1900, prompt_tokens=1000, buckets=BUCKETS, length_multiple=256, resident_shapes=2,
                     vision_bytes_per_sample=1000)
    assert (m.rows, m.cache_len) == (48, 2048)  # 33 rows run as the 48 bucket; 1900 positions round up to 8 × 256
    assert m.static_bytes == 48 * ROW_2048 == 3_696_807_936
    assert m.prefill_cache_bytes == 33 * PROMPT_1000 == 1_216_512_000  # every group's cache, all 33 prompts
    assert m.activation_bytes == 48 * 1000
    assert m.total_bytes == 2 * 3_696_807_936 + 1_216_512_000 + 48_000
    sampled = batch_memory(QWEN_3B, 4, 2048, logits_bytes=48)  # sampling's sort, mask and noise: 48 bytes per entry
    assert sampled.static_bytes == 4 * (2048 * 36_864 + 151_936 * 48)


def test_linear_attention_states_count_in_every_cache():
    """A hybrid model (Qwen3.5: 3 of 4 layers linear) holds each sequence's conv and recurrent states
    in every resident decode shape and in its prefill cache, whatever the length."""
    hybrid = ModelShape(layers=9, kv_heads=2, head_dim=256, hidden_size=2048, vocab_size=248_320, lm_params=2 * 10**9,
                        dtype_bytes=2, state_bytes_per_row=27 * 3_276_800)
    m = batch_memory(hybrid, 8, 1024, prompt_tokens=500, resident_shapes=2)
    kv = 9 * 2 * 256 * 2 * 2
    assert m.static_bytes == 8 * (1024 * kv + 27 * 3_276_800 + 248_320 * 10)
    assert m.prefill_cache_bytes == 8 * (500 * kv + 27 * 3_276_800)


def test_auto_batch_size_rounds_to_buckets():
    # budget int(0.85 × 4 GiB) = 3,650,722,201 bytes: 47 rows of 77,016,832 fit, 48 do not
    assert auto_batch_size(QWEN_3B, 4 * GIB, 2048) == 47
    assert auto_batch_size(QWEN_3B, 4 * GIB, 2048, buckets=BUCKETS) == 32  # 47 would run (and allocate) as 48
    assert auto_batch_size(QWEN_3B, 4 * GIB, 2048, buckets=BUCKETS, max_batch=40) == 32  # 40 is no bucket
    assert auto_batch_size(QWEN_3B, 4 * GIB, 1900, buckets=BUCKETS, length_multiple=256) == 32  # 1900 → 2048 positions
    assert auto_batch_size(QWEN_3B, 10 * 2**20, 2048, buckets=BUCKETS) == 1  # never below one


def test_auto_batch_size_counts_two_resident_shapes():
    # two caches: 154,033,664 bytes per row → 23 rows fit the 3,650,722,201-byte budget; buckets → 16
    assert auto_batch_size(QWEN_3B, 4 * GIB, 2048, resident_shapes=2) == 23
    assert auto_batch_size(QWEN_3B, 4 * GIB, 2048, resident_shapes=2, buckets=BUCKETS) == 16


def test_auto_batch_size_counts_the_prefill_caches():
    # 6 GiB × 0.85 = 5,476,083,302 bytes. 64 rows: 4,929,077,248 of static cache fits alone; with 1024-token
    # prompts every row's prefill cache (37,748,736) is alive too: 48 rows need 3,696,807,936 + 1,811,939,328
    # = 5,508,747,264 (over), 32 rows 2,464,538,624 + 1,207,959,552 = 3,672,498,176
    assert auto_batch_size(QWEN_3B, 6 * GIB, 2048, buckets=BUCKETS) == 64
    assert auto_batch_size(QWEN_3B, 6 * GIB, 2048, prompt_tokens=1024, buckets=BUCKETS) == 32
    # all together on 8 GiB (budget 7,301,444,403): 32 rows need 2 × 2,464,538,624 + 1,207,959,552 = 6,137,036,800
    assert auto_batch_size(QWEN_3B, 8 * GIB, 2048, resident_shapes=2, prompt_tokens=1024, buckets=BUCKETS) == 32


def test_cuda_batch_size_uses_the_decode_loops_constants():
    from vlmfast.engines.hf.capacity import PROMPT_SLACK_TOKENS, cuda_batch_size
    from vlmfast.engines.hf.capacity import BATCH_BUCKETS, LENGTH_BUCKET

    assert (BATCH_BUCKETS, LENGTH_BUCKET, PROMPT_SLACK_TOKENS) == (BUCKETS, 256, 64)  # the figures below
    # a 1000-token estimate plans 1064 (the template's slack): 2064 positions → 2304, not 2048; 32 rows:
    # 2 × 32 × (2304 × 36,864 + 1,519,360) + 32 × 1064 × 36,864 = 6,788,202,496 ≤ 7,301,444,403
    size, memory = cuda_batch_size(QWEN_3B, 8 * GIB, 1000, 1000)
    assert size == 32 and memory.rows == 32 and memory.cache_len == 2304
    assert memory.total_bytes == 6_788_202_496


def test_shape_from_a_real_model(loaded):
    shape = shape_from_model(loaded.model, "float32")
    text = loaded.model.config.get_text_config()
    assert (shape.layers, shape.kv_heads, shape.dtype_bytes) == (text.num_hidden_layers, text.num_key_value_heads, 4)
    vision = sum(p.numel() for p in loaded.model.model.visual.parameters())
    embed = loaded.model.get_input_embeddings().weight.numel()  # the tiny model's embeddings are untied
    assert shape.lm_params == sum(p.numel() for p in loaded.model.parameters()) - vision - embed > 0
    assert peak_bandwidth_gbps("NVIDIA GH200 480GB") == 4000.0


def test_cpu_threads_are_this_process_share_of_its_cores(monkeypatch):
    import os

    from vlmfast.engines.hf.capacity import cpu_threads

    cores = len(os.sched_getaffinity(0))
    for variable in ("LOCAL_WORLD_SIZE", "PYTEST_XDIST_WORKER_COUNT"):
        monkeypatch.delenv(variable, raising=False)
    assert cpu_threads() == (cores, f"the {cores} core(s) this process may use")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(cores))
    assert cpu_threads()[0] == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(4 * cores))  # more processes than cores: one thread each
    assert cpu_threads()[0] == 1 and "÷" in cpu_threads()[1]
    assert cpu_threads(3) == (3, "--threads")


def test_the_report_states_the_cpu_threads(grpo_ckpt, images, tmp_path):
    import json

    import torch

    from conftest import cli

    before = torch.get_num_threads()
    try:
        r = cli("infer", "--ckpt", grpo_ckpt, "--images", images[0], "--prompt", "p", "--max-new-tokens", "2",
                "--device", "cpu", "--threads", "1", "--out", tmp_path / "r.jsonl", "--json")
        report = json.loads(r.stdout)
        assert r.returncode == 0 and torch.get_num_threads() == 1
        assert "CPU threads: 1 (--threads)" in report["notes"]
    finally:
        torch.set_num_threads(before)
