"""Boxes in answers and ground truth: parsing ``[x1, y1, x2, y2]`` from JSON or text, IoU, and the
coordinate space a model family writes them in (standard library only)."""

from __future__ import annotations

import json
import math
import re

# Where a predicted box's coordinates live. resized: pixels of the image the model saw (Qwen2.5-VL),
# mapped back with the row's image_sizes / model_image_sizes; original: pixels of the image as given;
# rel1000: 0–1000 relative to the image (Qwen2-VL, Qwen3-VL, Qwen3.5), x_pixel = x / 1000 * original width.
BBOX_SPACES = ("resized", "original", "rel1000")
DEFAULT_BBOX_SPACE = "resized"

_BOX_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
_BOX_BRACKET = re.compile(rf"\[{_BOX_NUM},{_BOX_NUM},{_BOX_NUM},{_BOX_NUM}\]")
BOX_POINTS = re.compile(rf"\({_BOX_NUM},{_BOX_NUM}\)\s*,?\s*\({_BOX_NUM},{_BOX_NUM}\)")
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
_BOX_KEYS = ("bbox_2d", "bbox", "box")


def parse_box(value) -> list[float] | None:
    """The first box ``[x1, y1, x2, y2]`` in a JSON value or text, or None. Understands Qwen2.5-VL's
    ``[{"bbox_2d": [...], "label": …}]`` (also inside a fenced json block), nested lists and
    ``(x1,y1),(x2,y2)``."""
    if isinstance(value, (list, tuple, dict)):
        return _box_from_json(value)
    text = str(value)
    for candidate in [m.group(1) for m in _FENCE.finditer(text)] + [text]:
        try:
            box = _box_from_json(json.loads(candidate.strip()))
        except (ValueError, RecursionError):
            continue
        if box is not None:
            return box
    for pattern in (_BOX_BRACKET, BOX_POINTS):
        if (m := pattern.search(text)):
            return [float(g) for g in m.groups()]
    return None


def _box_from_json(value, depth: int = 0):
    if depth > 8:
        return None
    if isinstance(value, dict):
        key = next((k for k in _BOX_KEYS if k in value), None)
        return _box_from_json(value[key], depth + 1) if key else None
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if len(value) == 4 and all(_is_number(v) for v in value):
        return [float(v) for v in value]
    if len(value) == 2 and all(isinstance(p, (list, tuple)) and len(p) == 2 and all(map(_is_number, p)) for p in value):
        return [float(value[0][0]), float(value[0][1]), float(value[1][0]), float(value[1][1])]
    return _box_from_json(value[0], depth + 1)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def box_iou(a, b) -> float:
    """Intersection over union of two ``[x1, y1, x2, y2]`` boxes; 0 for degenerate or invalid boxes."""
    try:
        ax1, ay1, ax2, ay2 = (float(v) for v in a)
        bx1, by1, bx2, by2 = (float(v) for v in b)
    except (TypeError, ValueError):
        return 0.0
    if not all(math.isfinite(v) for v in (ax1, ay1, ax2, ay2, bx1, by1, bx2, by2)):
        return 0.0
    if ax2 <= ax1 or ay2 <= ay1 or bx2 <= bx1 or by2 <= by1:
        return 0.0
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    return inter / union if union > 0 else 0.0


def box_scale(image_size, model_size):
    """(x, y) factors from a box in ``model_size`` pixels to ``image_size`` pixels; None when a size is unknown."""
    try:
        (W, H), (w, h) = image_size, model_size
        W, H, w, h = float(W), float(H), float(w), float(h)
    except (TypeError, ValueError):
        return None
    return (W / w, H / h) if min(W, H, w, h) > 0 else None


def row_bbox_space(row: dict, override: str | None = None) -> str:
    """The coordinate space of a row's boxes: ``override`` when given (the caller knows better), else
    the row's own ``bbox_space`` (infer writes it from the model family), else ``"resized"``."""
    if override is not None:
        return override
    return row.get("bbox_space") or DEFAULT_BBOX_SPACE
