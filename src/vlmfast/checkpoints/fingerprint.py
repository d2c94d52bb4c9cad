"""Which weights produced a row: a fingerprint of a checkpoint's weight files, and a read-back check that a
model holds the weights of a checkpoint after they were copied into it.

:func:`fingerprint` is cheap by default: every safetensors header (names, dtypes, shapes, offsets) and, of
every tensor, ``SAMPLE_BYTES`` bytes at its start, middle and end — a few kilobytes read for a 3B model,
and an RL update changes nearly every tensor. ``full=True`` digests every byte instead (minutes for a
7B model on a slow disk). Other weight files (pickle ``.bin``) count by name, size and their first and
last ``SAMPLE_BYTES``. Equal files give equal fingerprints on every machine.

:func:`adapter_fingerprint` is a LoRA adapter checkpoint's: its ``adapter_model*`` files and the weights it
runs on, its base's fingerprint (when the base is a local model directory; a hub id, or a base not here,
counts by name only, and the fingerprint's ``of`` says so).

:func:`readback_mismatch` reads a few tensors of a checkpoint (first, middle and last by name, and the
LM head) from its files and compares them with the loaded model's: after an in-place swap, a model that
kept the previous step's numbers is caught at the step it happened.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

SAMPLE_BYTES = 64
READBACK = 4  # tensors compared after a swap


def weight_files(d: Path) -> list[Path]:
    """The full-model weight files of a checkpoint dir that transformers loads, sorted: ``model.safetensors``
    when it is there, else the shards its index names, else the pickles (adapters, trainer pickles and a
    stale set beside the loaded one aside: :func:`vlmfast.checkpoints.weight_files.loaded_files`)."""
    from vlmfast.checkpoints.weight_files import loaded_files

    return sorted(loaded_files(Path(d)))


def adapter_files(d: Path) -> list[Path]:
    """A LoRA adapter dir's weight files (``adapter_model.safetensors``, or the older ``.bin``), sorted."""
    return sorted(p for pattern in ("adapter_model*.safetensors", "adapter_model*.bin") for p in Path(d).glob(pattern))


def fingerprint(d, *, full: bool = False) -> dict:
    """``{"digest": "sampled:<16 hex>" | "full:<16 hex>", "files", "tensors", "bytes"}`` of the weight files in
    ``d`` (see the module docstring). Raises OSError / ValueError on an unreadable file."""
    return _of_files(weight_files(Path(d)), full)


def adapter_fingerprint(d, base: str | None = None, *, full: bool = False) -> dict:
    """:func:`fingerprint`'s fields over a LoRA adapter's files and its base's weights together, plus
    ``adapter`` (the adapter files' own fingerprint), ``base`` (``source``: the base as named — ``base``, else
    adapter_config.json's — and ``digest``: its fingerprint, None when its weights were not read) and ``of``
    (what the digest covers, in words). Raises OSError / ValueError on an unreadable file."""
    from vlmfast.checkpoints.locate import HUB_ID, locate
    from vlmfast.checkpoints.readers import adapter_base_or_none
    from vlmfast.errors import CheckpointError

    own = _of_files(adapter_files(Path(d)), full)
    spec = base or adapter_base_or_none(d)
    found, weights, why = None, None, "adapter_config.json names no base"
    if spec is not None and Path(spec).expanduser().is_dir():
        try:
            found = locate(spec)  # walked down as the loader walks it (a trainer output dir: its model)
        except CheckpointError:
            pass
    if found is not None and found.kind == "model":
        weights = fingerprint(found.path, full=full)
    elif spec is not None:
        why = (f"its base {spec} is a hub id, whose weights are not read: the base counts by name"
               if not Path(spec).expanduser().exists() and HUB_ID.match(spec)
               else f"its base {spec} is not a local model directory: it counts by name")
    base_part = weights["digest"].encode() if weights else b"name:" + (spec or "").encode("utf-8")
    h = hashlib.sha256(b"adapter\0" + own["digest"].encode() + b"\0config\0" + _adapter_settings(d) + b"\0base\0")
    h.update(base_part)
    # the digest vlmfast 0.17 and earlier recorded (no adapter_config.json settings): its records are still these weights
    h18 = hashlib.sha256(b"adapter\0" + own["digest"].encode() + b"\0base\0" + base_part)
    every = [own] + ([weights] if weights else [])
    kind = own["digest"].split(":")[0]
    return {"digest": f"{kind}:{h.hexdigest()[:16]}", "digest_before_0_18": f"{kind}:{h18.hexdigest()[:16]}",
            **{k: sum(f[k] for f in every) for k in ("files", "tensors", "bytes")},
            "adapter": own, "base": {"source": spec, "digest": weights["digest"] if weights else None},
            "of": f"the adapter's weights and its base's ({found.path})" if weights else f"the adapter's weights only ({why})"}


# adapter_config.json keys that do not change what the adapter computes (its base counts on its own)
_ADAPTER_CONFIG_IGNORED = frozenset({"base_model_name_or_path", "revision", "inference_mode", "peft_version",
                                     "auto_mapping", "task_type"})


def _adapter_settings(d) -> bytes:
    """What in adapter_config.json decides the adapter's output besides its tensors: ``lora_alpha`` (the
    scale B·A is added at), ``use_rslora``, ``use_dora``, ``rank_pattern`` / ``alpha_pattern``, target modules…"""
    from vlmfast.checkpoints.readers import adapter_config

    try:
        cfg = adapter_config(d)
    except Exception:  # unreadable: the loader says why
        return b""
    kept = {k: v for k, v in cfg.items() if k not in _ADAPTER_CONFIG_IGNORED}
    return json.dumps(kept, sort_keys=True, default=str).encode("utf-8")


def _of_files(files: list[Path], full: bool) -> dict:
    from vlmfast.checkpoints.readers import _safetensors_head

    h = hashlib.sha256()
    tensors, total = 0, 0
    for path in files:
        h.update(path.name.encode("utf-8") + b"\0")
        with open(path, "rb") as f:
            if path.suffix != ".safetensors":
                size = path.stat().st_size
                total += size
                h.update(str(size).encode())
                h.update(_read(f, 0, SAMPLE_BYTES) + _read(f, max(0, size - SAMPLE_BYTES), SAMPLE_BYTES))
                continue
            size, header = _safetensors_head(path)
            h.update(json.dumps(header, sort_keys=True).encode("utf-8"))
            start = 8 + size
            if full:
                f.seek(start)
                while block := f.read(1 << 20):
                    h.update(block)
            for name in sorted(n for n in header if n != "__metadata__"):
                begin, end = (int(x) for x in header[name]["data_offsets"])
                tensors, total = tensors + 1, total + end - begin
                if not full:
                    h.update(_samples(f, start + begin, end - begin))
    method = "full" if full else "sampled"
    return {"digest": f"{method}:{h.hexdigest()[:16]}", "files": len(files), "tensors": tensors, "bytes": total}


def _read(f, offset: int, n: int) -> bytes:
    f.seek(offset)
    return f.read(n)


def _samples(f, offset: int, length: int) -> bytes:
    if length <= 3 * SAMPLE_BYTES:
        return _read(f, offset, length)
    middle = offset + (length - SAMPLE_BYTES) // 2
    last = offset + length - SAMPLE_BYTES
    return _read(f, offset, SAMPLE_BYTES) + _read(f, middle, SAMPLE_BYTES) + _read(f, last, SAMPLE_BYTES)


def readback_names(pairs: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Which of a checkpoint's (file, saved name, model name) triples to read back: first, middle and last by
    name, and the LM head when it is saved (the tensor a wrong load most often gets wrong)."""
    ordered = sorted(pairs, key=lambda p: p[1])
    if len(ordered) <= READBACK:
        return ordered
    picked = [ordered[0], ordered[len(ordered) // 2], ordered[-1]]
    head = next((p for p in ordered if p[1].endswith("lm_head.weight")), ordered[len(ordered) // 4])
    return list(dict.fromkeys(picked + [head]))


def readback_mismatch(state: dict, directory: Path, pairs: list[tuple[str, str, str]]) -> str | None:
    """The first of the :func:`readback_names` tensors whose values in ``state`` (the model's state dict)
    differ from the checkpoint's own (cast to the model's dtype, as the copy does), or None when all agree."""
    import torch
    from safetensors import safe_open

    for file, name, home in readback_names(pairs):
        with safe_open(str(Path(directory) / file), framework="pt", device="cpu") as f:
            saved = f.get_tensor(name)
        held = state[home].detach()
        if not torch.equal(saved.to(held.dtype), held.to("cpu")):
            return f"{name} holds other values than {Path(directory).name}/{file} saves"
    return None


def weights_fingerprint(found, how: str = "sampled", base: str | None = None) -> dict | None:
    """The fingerprint of a local checkpoint's weights (``how``: ``sampled`` or ``full``): a model's, or a LoRA
    adapter's with its base's (``base``: the one it runs on, default the one adapter_config.json names); None
    for a hub id, or files that cannot be read (the loader says why)."""
    if found is None or not found.is_local or found.kind not in ("model", "adapter"):
        return None
    try:
        if found.kind == "adapter":
            return adapter_fingerprint(found.path, base, full=how == "full")
        return fingerprint(found.path, full=how == "full")
    except (OSError, ValueError, KeyError, TypeError):
        return None
