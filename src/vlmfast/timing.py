"""Clocks that tell the truth on accelerators, percentiles, peak memory.

CUDA kernels run asynchronously: reading ``perf_counter`` without synchronizing measures when
work was *queued*, not when it finished. Every clock read here synchronizes the device first.
"""

from __future__ import annotations

import contextlib
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


def spread(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    """(min, max, coefficient of variation in %) of repeated measurements. The CV is the sample
    standard deviation (n − 1) over the mean: None for fewer than two values or a mean of zero."""
    if not values:
        return None, None, None
    mean = sum(values) / len(values)
    if len(values) < 2 or mean == 0:
        return min(values), max(values), None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return min(values), max(values), 100 * sd / abs(mean)


def reset_peak_memory(device) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def free_bytes(device) -> int | None:
    """Memory free for another model on ``device``: CUDA's free bytes, else the machine's available memory
    (Linux's MemAvailable). None where neither can be read."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_memory_mib(device) -> tuple[float, str]:
    """(peak MiB, what was measured). CUDA: the caching allocator's peak allocated bytes since
    the last reset. CPU: the process's peak resident set size (lifetime, so it includes loading)."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return (rss / 2**20 if sys.platform == "darwin" else rss / 1024), "process_peak_rss"


def summarize_timings(timings) -> dict:
    """Phase figures from per-batch timings (anything with ``size``, ``ttft_s``, ``decode_s``, ``steps``,
    ``vision_s``, ``syncs``, optionally ``cache_fill_s``): TTFT percentiles per sample (each sample waits for
    its whole batch), decode time per step after the first token (= per token of one sequence), prefill,
    vision and cache-fill totals."""
    ttft_ms = [t.ttft_s * 1000 for t in timings for _ in range(t.size)]
    steps = sum(max(t.steps - 1, 0) for t in timings)
    decode_s = sum(t.decode_s for t in timings)
    vision = [t.vision_s for t in timings if t.vision_s is not None]
    fills = [t.cache_fill_s for t in timings if getattr(t, "cache_fill_s", None) is not None]
    return {
        "ttft_ms_p50": rounded(percentile(ttft_ms, 50)),
        "ttft_ms_p90": rounded(percentile(ttft_ms, 90)),
        "decode_ms_per_token": rounded(decode_s * 1000 / steps) if steps else None,
        "prefill_s": rounded(sum(t.ttft_s for t in timings), 4),
        "vision_s": rounded(sum(vision), 4) if vision else None,
        "cache_fill_s": rounded(sum(fills), 4) if fills else None,
        "decode_s": rounded(decode_s, 4),
        "decode_steps": steps,
        "device_syncs": sum(t.syncs for t in timings),
    }


class StepClock:
    """A logits processor that reads the clock when logits for a new token are ready (``--decoder hf``:
    the only window into ``generate``'s loop). The first call marks the first token (TTFT); later calls
    only when asked, since each synchronizes."""

    def __init__(self, device, every_step: bool):
        self.device = device
        self.every_step = every_step
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        if self.every_step or not self.times:
            self.times.append(now(self.device))
        return scores


class StepTimes:
    """When each decode step finished, without making the host wait: on CUDA an event is recorded after each
    step (no synchronize, so a replayed graph's steps run back to back as in a real run) and read once at
    the end; on a CPU the clock is read directly. Call it after each step; :meth:`times` gives host-clock
    seconds, counted from when the clock was made."""

    def __init__(self, device):
        self.cuda = str(device).startswith("cuda")
        self.marks: list = []
        if self.cuda:
            import torch

            self._event = lambda: torch.cuda.Event(enable_timing=True)
            self.start = self._event()
            self.start.record()
        self.origin = time.perf_counter()

    def __call__(self, step=None) -> None:
        if self.cuda:
            event = self._event()
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def times(self) -> list[float]:
        if not self.cuda:
            return list(self.marks)
        if self.marks:
            self.marks[-1].synchronize()
        return [self.origin + self.start.elapsed_time(event) / 1000 for event in self.marks]


class _Marks:
    seconds: float | None = None
    marks: list | None = None  # the device-synchronized times before and after each call, while the block is open

    def count(self) -> int:
        return len(self.marks or ())

    def drop_since(self, count: int) -> None:
        """Forget the calls marked after the first ``count`` marks (a call that does not count: one that compiled)."""
        if self.marks is not None:
            del self.marks[count:]


@contextlib.contextmanager
def vision_clock(model, device):
    """Times the vision tower inside a block (device-synchronized hooks before and after each call: prefill
    groups call it in turn); the total lands in the yielded object's ``seconds`` on exit (None: no tower)."""
    result = _Marks()
    visual = getattr(getattr(model, "model", None), "visual", None)
    if visual is None:
        yield result
        return
    marks: list[float] = []
    result.marks = marks  # a caller may drop the marks of a call that does not count (one that compiled)

    def mark(*_):
        marks.append(now(device))

    handles = [visual.register_forward_pre_hook(mark), visual.register_forward_hook(mark)]
    try:
        yield result
    finally:
        for h in handles:
            h.remove()
        if len(marks) >= 2:
            result.seconds = sum(b - a for a, b in zip(marks[::2], marks[1::2]))


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError)


def free_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def free_memory() -> None:
    """What a dropped model held, given back now (the GPU's cached blocks too), before the next one loads."""
    import gc

    gc.collect()
    if "torch" in sys.modules:
        free_device_cache()


def versions() -> dict:
    """What measured the figures: vlmfast, torch, transformers and Python versions (read from the installed
    packages' metadata: the report needs no torch import)."""
    import platform
    from importlib import metadata

    from vlmfast import __version__

    def installed(name: str) -> str | None:
        # the metadata always, imported or not: torch's own __version__ may name its build (+cu130) where the
        # metadata does not, and one environment must read the same in every record
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return getattr(sys.modules.get(name), "__version__", None)

    return {"vlmfast": __version__, "torch": installed("torch"), "transformers": installed("transformers"),
            "python": platform.python_version()}


def rounded(value, digits=3):
    """``value`` rounded for a report; None stays None."""
    return None if value is None else round(value, digits)
