"""Batch formation: group requests of similar cost so left padding stays small. Pure functions.

Cost is the number of tokens a request puts into prefill (image tokens + prompt tokens); sorting
by it before chunking means each batch pads to a near-equal length. Results are keyed by the
request's input index, so order is restored by the caller, whatever the batch order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def image_tokens(width: int, height: int, *, min_pixels: int, max_pixels: int, patch_size: int = 14, merge_size: int = 2) -> int:
    """Image tokens Qwen2.5-VL spends on a ``width``×``height`` image after its smart resize
    (one token per (patch·merge)² block)."""
    h, w = smart_resize(height, width, factor=patch_size * merge_size, min_pixels=min_pixels, max_pixels=max_pixels)
    return (h // (patch_size * merge_size)) * (w // (patch_size * merge_size))


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize rule: both sides multiples of ``factor``, area within [min, max], aspect kept."""
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def easyr1_size(width: int, height: int, min_pixels: int | None, max_pixels: int | None) -> tuple[int, int]:
    """The size EasyR1's ``process_image`` scales an image to: into ``max_pixels`` when above it, then up to
    ``min_pixels`` when below it, each side ``int(side · sqrt(bound / area))`` (None: no bound that side)."""
    if max_pixels is not None and width * height > max_pixels:
        factor = math.sqrt(max_pixels / (width * height))
        width, height = int(width * factor), int(height * factor)
    if min_pixels is not None and width * height < min_pixels:
        factor = math.sqrt(min_pixels / (width * height))
        width, height = int(width * factor), int(height * factor)
    return width, height


def plan_batches(costs: Sequence[int], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Indices grouped into batches of at most ``batch_size`` — and, with ``max_tokens``, at most that
    many padded prefill tokens (batch length × its widest request) — most expensive first, so an
    out-of-memory batch shows up at once, not at 90%. Ties keep input order: deterministic. A request
    wider than ``max_tokens`` on its own still gets a batch of one."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # sorted descending, so the batch's first request is its widest: padded size = len × that cost
        if current and (len(current) == batch_size
                        or (max_tokens is not None and (len(current) + 1) * costs[current[0]] > max_tokens)):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
