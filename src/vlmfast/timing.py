"""Clocks that tell the truth on accelerators, percentiles, peak memory.

CUDA kernels run asynchronously: reading ``perf_counter`` without synchronizing measures when
work was *queued*, not when it finished. Every clock read here synchronizes the device first.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from collections.abc import Sequence


def device_sync(device) -> None:
    """Wait for queued work on ``device`` (a ``torch.device`` or string); a no-op on CPU."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def now(device=None) -> float:
    """Seconds on a monotonic clock, after the device has finished its queued work."""
    if device is not None:
        device_sync(device)
    return time.perf_counter()


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); ``None`` for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be within [0, 100]")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


def reset_peak_memory(device) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mib(device) -> tuple[float, str]:
    """(peak MiB, what was measured). CUDA: the caching allocator's peak allocated bytes since
    the last reset. CPU: the process's peak resident set size (lifetime, so it includes loading)."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return (rss / 2**20 if sys.platform == "darwin" else rss / 1024), "process_peak_rss"
