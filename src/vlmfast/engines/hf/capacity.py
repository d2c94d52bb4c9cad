"""The static decode shapes (batch and cache-length buckets), and how much fits on a CUDA device: the auto
batch size from what a batch of vlmfast's engine really holds (bucketed static caches, resident decode
shapes, a prefill group's cache, vision activations). Pure arithmetic on config numbers."""

from __future__ import annotations

from dataclasses import dataclass

from vlmfast.engines.bandwidth import ModelShape

# Static decode shapes (CUDA graphs, torch.compile): a captured batch size serves any number of rows up to
# it (spare rows are padding, their output ignored), and cache lengths are rounded up to a multiple of
# LENGTH_BUCKET, so batches share a captured graph.
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
LENGTH_BUCKET = 256


def batch_bucket(rows: int) -> int:
    """The captured batch size that serves ``rows``."""
    return next((b for b in BATCH_BUCKETS if b >= rows), rows)


def length_bucket(length: int) -> int:
    return -(-length // LENGTH_BUCKET) * LENGTH_BUCKET


# Static decode shapes the engine keeps built at once, each holding a KV cache: on CUDA the newest two
# captured (batch, cache length) shapes, so a run alternating between two shapes does not re-capture.
RESIDENT_SHAPES = {"cuda": 2, "cpu": 3}
# Padded prompt tokens per prefill pass (rows × widest prompt); the group's HF cache lives while the
# static cache is filled. Measured on 2 CPU cores (demo model, 224–640 px images): prefill of 32 images
# slows by a third past ~4k tokens at once (the vision tower's activations leave the caches), while
# decode keeps gaining from all 32 rows. A GPU prefills far more at once; its limit is activation memory.
PREFILL_TOKENS = {"cuda": 32768, "cpu": 2048}
# Bytes per vocabulary entry per row while the next token is chosen: the model's logits, their float32
# copy and the biased scores (greedy); sampling adds the sorted scores and their int64 order, the nucleus
# mask, the probabilities and the int64 noise hashes with their float uniforms (about 38 more at once).
LOGITS_BYTES = {"greedy": 10, "sampled": 48}
# A prompt's token estimate counts image tokens exactly (from the image headers) and text at 3 characters
# a token; the chat template and vision markers add a few dozen. Planning for this many more keeps a
# prompt estimated just under a cache-length boundary from running, unplanned, in the next length bucket.
PROMPT_SLACK_TOKENS = 64


@dataclass(frozen=True)
class BatchMemory:
    """Device memory a batch of ``rows`` needs beyond the weights, by part (bytes)."""

    rows: int  # the batch as it runs: rounded up to a captured batch bucket
    cache_len: int  # positions per row in the static cache: prompt + new tokens, rounded up
    static_bytes: int  # one decode shape: KV cache of rows × cache_len, linear-attention states, logits
    resident_shapes: int  # decode shapes holding such a cache at once
    prefill_cache_bytes: int  # every prefill group's HF cache: all alive until the static cache is filled
    activation_bytes: int  # vision tower activations of the rows (prefill)

    @property
    def total_bytes(self) -> int:
        return self.static_bytes * self.resident_shapes + self.prefill_cache_bytes + self.activation_bytes


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def batch_memory(shape: ModelShape, rows: int, context_tokens: int, *, prompt_tokens: int = 0,
                 buckets: tuple[int, ...] = (), length_multiple: int = 1, resident_shapes: int = 1,
                 vision_bytes_per_sample: int = 0, logits_bytes: int = LOGITS_BYTES["greedy"]) -> BatchMemory:
    """What a batch of ``rows`` with contexts up to ``context_tokens`` (prompt + new tokens) holds at
    its peak: ``resident_shapes`` static caches of the bucketed batch (the first of ``buckets`` that
    is >= rows; rows as given without buckets) × the context rounded up to ``length_multiple``, each
    with its rows' linear-attention states and ``logits_bytes`` per vocabulary entry per row; the prefill
    caches of every group of the batch (rows × ``prompt_tokens`` positions and states — prefill keeps
    them all until decode copies them in); vision activations."""
    run_rows = next((b for b in buckets if b >= rows), rows)
    cache_len = _round_up(context_tokens, length_multiple)
    per_row = shape.state_bytes_per_row
    return BatchMemory(
        rows=run_rows, cache_len=cache_len,
        static_bytes=run_rows * (cache_len * shape.kv_bytes_per_token + per_row + shape.vocab_size * logits_bytes),
        resident_shapes=resident_shapes,
        prefill_cache_bytes=rows * (prompt_tokens * shape.kv_bytes_per_token + per_row),
        activation_bytes=run_rows * vision_bytes_per_sample,
    )


def auto_batch_size(
    shape: ModelShape,
    free_bytes: int,
    context_tokens: int,
    *,
    vision_bytes_per_sample: int = 0,
    headroom: float = 0.85,
    max_batch: int = 64,
    buckets: tuple[int, ...] = (),
    **memory,
) -> int:
    """The largest batch whose :func:`batch_memory` fits in ``headroom`` of the memory left after
    loading the weights, at most ``max_batch``, at least 1. With ``buckets`` (the captured batch
    sizes of CUDA graphs) only a bucket is chosen: 33 rows would run — and allocate — as 48, so when
    48 does not fit the answer is 32. ``memory``: the other keywords of :func:`batch_memory`."""
    budget = int(free_bytes * headroom)
    sizes = [b for b in buckets if b <= max_batch] or range(1, max_batch + 1)
    fits = [n for n in sizes if batch_memory(shape, n, context_tokens, buckets=buckets,
                                             vision_bytes_per_sample=vision_bytes_per_sample,
                                             **memory).total_bytes <= budget]
    return max(fits, default=1)


def cuda_batch_size(shape: ModelShape, free_bytes: int, prompt_tokens: int, max_new_tokens: int, *,
                    vision_bytes_per_sample: int = 0, max_batch: int = 64, sampled: bool = False) -> tuple[int, BatchMemory]:
    """:func:`auto_batch_size` for vlmfast's CUDA decode: CUDA-graph batch buckets, cache lengths
    rounded to the captured length multiple (the prompt estimate plus ``PROMPT_SLACK_TOKENS``), two
    resident decode shapes, and the batch's prefill caches beside them. Returns the batch size and its
    memory by part."""

    prompt_tokens += PROMPT_SLACK_TOKENS
    memory = dict(prompt_tokens=prompt_tokens, length_multiple=LENGTH_BUCKET, resident_shapes=RESIDENT_SHAPES["cuda"],
                  vision_bytes_per_sample=vision_bytes_per_sample,
                  logits_bytes=LOGITS_BYTES["sampled" if sampled else "greedy"])
    context = prompt_tokens + max_new_tokens
    size = auto_batch_size(shape, free_bytes, context, max_batch=max_batch, buckets=BATCH_BUCKETS, **memory)
    return size, batch_memory(shape, size, context, buckets=BATCH_BUCKETS, **memory)


def cpu_threads(requested: int | None = None) -> tuple[int, str]:
    """Threads for torch on a CPU, and why: ``requested`` (``--threads``), else this process's share of the
    cores it may run on — ``os.sched_getaffinity`` ÷ the processes started beside it on this machine
    (accelerate's ``LOCAL_WORLD_SIZE``, pytest-xdist's workers). Measured on 2 cores with one other busy
    process: torch's default of 2 threads made a decode step 4× slower than 1 thread (OpenMP threads spin
    waiting for a core that is taken)."""
    import os

    if requested:
        return requested, "--threads"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for variable in ("LOCAL_WORLD_SIZE", "PYTEST_XDIST_WORKER_COUNT"):
        value = os.environ.get(variable, "")
        if value.isdigit() and int(value) > 1:
            return max(1, cores // int(value)), f"{cores} core(s) this process may use ÷ {value} local processes"
    return cores, f"the {cores} core(s) this process may use"

