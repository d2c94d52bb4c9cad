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
    assert auto_batch_size(QWEN_3B, 4 * gib, 2048) == 47  # 0.85 × 4 GiB ÷ (72 MiB + 1.2 MB logits)
    assert auto_batch_size(QWEN_3B, 4 * gib, 2048, vision_bytes_per_sample=200 * 2**20) == 12
    assert auto_batch_size(QWEN_3B, 10 * 2**20, 2048) == 1  # never below one


# vlmfast's CUDA graph buckets and length multiple, written out: the figures below are computed by hand
BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
GIB = 2**30
ROW_2048 = 2048 * 36_864 + 151_936 * 8  # one row's KV cache at 2048 positions + float32 logits and a copy = 76,712,960


def test_batch_memory_parts_by_hand():
    m = batch_memory(QWEN_3B, 33, 1900, prompt_tokens=1000, buckets=BUCKETS, length_multiple=256, resident_shapes=2,
                     prefill_group_tokens=32768, vision_bytes_per_sample=1000)
    assert (m.rows, m.cache_len) == (48, 2048)  # 33 rows run as the 48 bucket; 1900 positions round up to 8 × 256
    assert m.static_bytes == 48 * ROW_2048 == 3_682_222_080
    assert m.prefill_cache_bytes == 32768 * 36_864  # 33 × 1000 prompt tokens > one group of 32768: the group
    assert m.activation_bytes == 48 * 1000
    assert m.total_bytes == 2 * 3_682_222_080 + 1_207_959_552 + 48_000
    small = batch_memory(QWEN_3B, 4, 2048, prompt_tokens=1000, prefill_group_tokens=32768)
    assert (small.rows, small.prefill_cache_bytes) == (4, 4000 * 36_864)  # fewer prompt tokens than a group


def test_auto_batch_size_rounds_to_buckets():
    # budget int(0.85 × 4 GiB) = 3,650,722,201 bytes: 47 rows of 76,712,960 fit, 48 do not
    assert auto_batch_size(QWEN_3B, 4 * GIB, 2048) == 47
    assert auto_batch_size(QWEN_3B, 4 * GIB, 2048, buckets=BUCKETS) == 32  # 47 would run (and allocate) as 48
    assert auto_batch_size(QWEN_3B, 4 * GIB, 2048, buckets=BUCKETS, max_batch=40) == 32  # 40 is no bucket
    assert auto_batch_size(QWEN_3B, 4 * GIB, 1900, buckets=BUCKETS, length_multiple=256) == 32  # 1900 → 2048 positions
    assert auto_batch_size(QWEN_3B, 10 * 2**20, 2048, buckets=BUCKETS) == 1  # never below one


def test_auto_batch_size_counts_two_resident_shapes():
    # two caches: 153,425,920 bytes per row → 23 rows fit the 3,650,722,201-byte budget; buckets → 16
    assert auto_batch_size(QWEN_3B, 4 * GIB, 2048, resident_shapes=2) == 23
    assert auto_batch_size(QWEN_3B, 4 * GIB, 2048, resident_shapes=2, buckets=BUCKETS) == 16


def test_auto_batch_size_counts_the_prefill_cache():
    # 6 GiB × 0.85 = 5,476,083,302 bytes. 64 rows: 4,909,629,440 of static cache fits alone, but not with
    # one prefill group's cache beside it (32768 × 36,864 = 1,207,959,552); 48 rows: 4,890,181,632 fit
    memory = dict(prompt_tokens=1024, buckets=BUCKETS)
    assert auto_batch_size(QWEN_3B, 6 * GIB, 2048, **memory) == 64
    assert auto_batch_size(QWEN_3B, 6 * GIB, 2048, prefill_group_tokens=32768, **memory) == 48
    # all together on 8 GiB (budget 7,301,444,403): 48 rows need 2 × 3,682,222,080 + 1,207,959,552 bytes,
    # 32 rows 2 × 2,454,814,720 + 1,207,959,552 = 6,117,588,992
    assert auto_batch_size(QWEN_3B, 8 * GIB, 2048, resident_shapes=2, prefill_group_tokens=32768, **memory) == 32


def test_cuda_batch_size_uses_the_decode_loops_constants():
    from vlmfast.engines.hf.capacity import cuda_batch_size
    from vlmfast.engines.hf.decode import BATCH_BUCKETS, LENGTH_BUCKET
    from vlmfast.engines.hf.capacity import PREFILL_TOKENS

    assert (BATCH_BUCKETS, LENGTH_BUCKET, PREFILL_TOKENS["cuda"]) == (BUCKETS, 256, 32768)  # the figures above
    size, memory = cuda_batch_size(QWEN_3B, 8 * GIB, 1024, 1000)  # 2024 positions → 2048
    assert size == 32 and memory.rows == 32 and memory.cache_len == 2048
    assert memory.total_bytes == 6_117_588_992


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
