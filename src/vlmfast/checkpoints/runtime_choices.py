"""The ``--device``, ``--dtype`` and ``--attn`` values the loader takes, in one place: read by the loader
(:func:`vlmfast.checkpoints.load.choose_runtime`) and by the options that carry them
(:class:`~vlmfast.run.options.InferOptions`, :class:`~vlmfast.run.bench_options.BenchOptions`), which check
them when they are made: a run whose rows are all already in ``--out`` never loads the model, and an
unknown value is an error there too. Whether this machine can run a choice (CUDA, flash-attn) is the
loader's to say. Imports nothing: the options are made before torch is imported."""

from __future__ import annotations

import re

from vlmfast.errors import UsageError, check_choice

DTYPE_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "fp32": "float32", "float32": "float32", "float": "float32",
}
ATTN_CHOICES = ("flash_attention_2", "sdpa", "eager")
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")  # matched against the lower-cased value


def check_device(device: str | None) -> str:
    """``--device`` lower-cased ("auto" for None); a UsageError for anything but auto, cpu, cuda or cuda:N
    (the empty text too, as for ``--dtype``: an unset shell variable is not a choice)."""
    device = "auto" if device is None else device.lower()
    if not DEVICE.fullmatch(device):
        raise UsageError(f"--device {device or repr('')}: unsupported", hint="use auto, cpu, cuda or cuda:N")
    return device


def check_dtype(dtype: str | None) -> str | None:
    """``--dtype``'s torch name (None for None or "auto"); a UsageError for a name not among the aliases."""
    if dtype in (None, "auto"):
        return None
    if dtype.lower() not in DTYPE_ALIASES:
        raise UsageError(f"--dtype {dtype}: unknown", hint="use auto, bfloat16, float16 or float32")
    return DTYPE_ALIASES[dtype.lower()]


def check_attn(attn: str | None) -> None:
    """A UsageError unless ``--attn`` is None, auto or one of :data:`ATTN_CHOICES`."""
    if attn is not None:
        check_choice("--attn", attn, ("auto", *ATTN_CHOICES))


def check_runtime_choices(device: str | None, dtype: str | None, attn: str | None) -> None:
    check_device(device)
    check_dtype(dtype)
    check_attn(attn)
