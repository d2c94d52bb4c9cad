"""Find a checkpoint, see where its KV cache is switched off, pick device/dtype/attention, load it.

The pure parts (path resolution, config inspection, runtime choice) work on paths and dicts and are
tested without a model. See FIELD-NOTES: ``generate`` reads only ``generation_config.use_cache``,
so the fix is to set it on the loaded model *and* pass ``use_cache=True`` to every generate call.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CheckpointError, UsageError

CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
GLOBAL_STEP_DIR = re.compile(r"^global_step_(\d+)$")  # EasyR1 / verl
SWIFT_RUN_DIR = re.compile(r"^v(\d+)-")  # ms-swift: output/v0-20250101-120000/checkpoint-N
FSDP_SHARDS = "model_world_size_*_rank_*.pt"  # EasyR1 per-rank model shards, beside huggingface/
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
TESTED_MODEL_TYPES = ("qwen2_5_vl",)
IM_END = "<|im_end|>"

DTYPE_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "fp32": "float32", "float32": "float32", "float": "float32",
}
ATTN_CHOICES = ("flash_attention_2", "sdpa", "eager")


@dataclass(frozen=True)
class Resolved:
    """What to hand to ``from_pretrained``: a local directory or a hub id, and how we got there.
    ``kind`` is ``"adapter"`` for a LoRA adapter dir (only with ``resolve_checkpoint(adapters=True)``)."""

    source: str
    is_local: bool
    note: str | None = None
    kind: str = "model"


def has_weights(directory: Path) -> bool:
    """Full-model weights (a LoRA ``adapter_model.*`` alone does not count)."""
    return any(not p.name.startswith("adapter_model") for pattern in WEIGHT_GLOBS for p in directory.glob(pattern))


@dataclass(frozen=True)
class Located:
    """Where a trainer output layout keeps its model. ``kind``: ``model`` (config + weights),
    ``adapter`` (LoRA adapter dir), ``fsdp`` (EasyR1 ``huggingface/`` dir whose weights are still the
    per-rank ``shards`` beside it) or ``incomplete`` (config.json, no weights)."""

    path: Path
    kind: str
    note: str | None = None
    shards: tuple[Path, ...] = ()


def locate_checkpoint(path: Path) -> Located:
    """Walk a local directory down to the model it holds, loading nothing: a model dir; a LoRA adapter
    dir; ``checkpoint-N`` (HF Trainer, VLM-R1: highest N with weights); EasyR1
    ``global_step_N/actor/huggingface``; ms-swift ``vX-*/checkpoint-N`` (highest version with weights).
    Raises CheckpointError when nothing there looks like a checkpoint."""
    from .lora import is_adapter_dir

    if (path / "config.json").is_file() and has_weights(path):
        return Located(path, "model")
    if is_adapter_dir(path):
        return Located(path, "adapter")
    for sub in ("huggingface", "actor/huggingface"):  # EasyR1 actor/ and global_step_N/
        if (path / sub / "config.json").is_file():
            return _nested(path / sub, f"using {sub}")
    for pattern, label in ((CHECKPOINT_DIR, "checkpoint-N"), (GLOBAL_STEP_DIR, "global_step_N")):
        if numbered := _numbered(path, pattern):
            return _highest(path, numbered, label)
    if runs := _numbered(path, SWIFT_RUN_DIR):
        for _, run in runs:
            try:
                found = locate_checkpoint(run)
            except CheckpointError:
                continue
            if found.kind in ("model", "adapter"):
                where = found.path.relative_to(path).as_posix()
                return Located(found.path, found.kind, f"using {where} (latest ms-swift run with weights, highest checkpoint-N)")
        raise CheckpointError(
            f"{path}: none of its ms-swift runs ({', '.join(r.name for _, r in runs[:5])}) holds a checkpoint-N with weights",
            hint="point --ckpt at a vX-*/checkpoint-N directory that holds weights or a LoRA adapter",
        )
    if (path / "config.json").is_file():
        shards = tuple(sorted(path.parent.glob(FSDP_SHARDS))) if path.name == "huggingface" else ()
        return Located(path, "fsdp" if shards else "incomplete", shards=shards)
    raise CheckpointError(
        f"{path}: not a checkpoint (no config.json, no checkpoint-N subdirectories)",
        hint="point --ckpt at the model directory (the one holding config.json)",
    )


def _numbered(path: Path, pattern: re.Pattern) -> list[tuple[int, Path]]:
    """Subdirectories whose name matches ``pattern`` (group 1 a number), highest number first."""
    return sorted(
        ((int(m.group(1)), child) for child in path.iterdir() if child.is_dir() and (m := pattern.match(child.name))),
        key=lambda item: (item[0], item[1].name), reverse=True,
    )


def _nested(child: Path, note: str) -> Located:
    found = locate_checkpoint(child)
    return Located(found.path, found.kind, note, found.shards)


def _highest(path: Path, numbered: list[tuple[int, Path]], label: str) -> Located:
    located = []
    for n, child in numbered:
        try:
            located.append((n, child, locate_checkpoint(child)))
        except CheckpointError:
            pass
    usable = [(n, d, found) for n, d, found in located if found.kind in ("model", "adapter")]
    if usable:
        n, chosen, found = usable[0]
        merged = chosen.with_name(chosen.name + "-merged")  # ms-swift export --merge_lora writes it beside
        if found.kind == "adapter" and (merged / "config.json").is_file() and has_weights(merged):
            found = Located(merged, "model")
        where = found.path.relative_to(path).as_posix()
        note = f"using {where} (highest of {len(usable)} {label} dirs with weights in {path})"
        skipped = [d.name for m, d in numbered if m > n]
        if skipped:
            note += f"; skipped {', '.join(skipped)}: no config.json or weights"
        return Located(found.path, found.kind, note, found.shards)
    unmerged = [found for _, _, found in located if found.kind == "fsdp"]
    if unmerged:  # EasyR1 before model_merger.py: say so rather than "no weights"
        found = unmerged[0]
        return Located(found.path, "fsdp", f"using {found.path.relative_to(path).as_posix()} (highest {label})", found.shards)
    raise CheckpointError(
        f"{path}: none of its {label} dirs ({', '.join(d.name for _, d in numbered[:5])}) holds config.json and weights",
        hint="point --ckpt at a directory with config.json and *.safetensors; merge FSDP/LoRA outputs first",
    )


def fsdp_merge_hint(located: Located) -> str:
    """How to turn EasyR1's per-rank FSDP shards into a loadable checkpoint."""
    actor = located.path.parent
    return (f"merge the shards with EasyR1: python3 scripts/model_merger.py --local_dir {actor} "
            f"(it writes the weights into {located.path}), then point --ckpt at {located.path}")


def resolve_checkpoint(spec: str, *, adapters: bool = False) -> Resolved:
    """A model directory, a trainer output directory (``checkpoint-N``: the highest N that holds
    weights wins; EasyR1 ``global_step_N/actor/huggingface``; ms-swift ``vX-*/checkpoint-N``), or a
    hub id. A LoRA adapter dir resolves (``kind="adapter"``) only with ``adapters=True``; otherwise,
    like unmerged FSDP shards, it is a CheckpointError whose hint says what to do."""
    path = Path(spec).expanduser()
    if path.is_dir() and not os.access(path, os.R_OK | os.X_OK):
        raise CheckpointError(f"{path}: directory is not readable (permissions)", hint="check the owner and mode of the directory")
    if path.is_dir():
        found = locate_checkpoint(path)
        if found.kind == "model" or (found.kind == "adapter" and adapters):
            return Resolved(str(found.path), True, found.note, found.kind)
        if found.kind == "adapter":
            from .lora import adapter_base_or_none

            raise CheckpointError(
                f"{found.path}: a LoRA adapter (base: {adapter_base_or_none(found.path) or 'not named'}), not a full model",
                hint=f"load it on its base model (infer --base BASE), or merge it: vlmfast fix {found.path} --merge-lora OUT",
            )
        if found.kind == "fsdp":
            raise CheckpointError(
                f"{found.path.parent}: {len(found.shards)} FSDP shards ({found.shards[0].name}, ...) not merged; "
                f"{found.path} has config.json but no weights",
                hint=fsdp_merge_hint(found),
            )
        raise CheckpointError(
            f"{found.path}: config.json but no weights (*.safetensors / *.bin)",
            hint="the save may be incomplete, or weights are sharded per rank and need merging",
        )
    if path.exists():
        raise CheckpointError(f"{path}: is a file, not a checkpoint directory", hint="point --ckpt at the directory")
    if HUB_ID.match(spec) and not Path(spec.split("/")[0]).is_dir():
        return Resolved(spec, False, "hub id")
    raise CheckpointError(f"{spec}: no such directory", hint="check the path; hub ids look like org/name")


def read_configs(resolved: Resolved) -> tuple[dict, dict | None]:
    """Raw config.json and generation_config.json (None when absent), exactly as saved."""
    if resolved.is_local:
        base = Path(resolved.source)
        paths = base / "config.json", base / "generation_config.json"
    else:
        from transformers.utils import cached_file

        paths = (
            Path(cached_file(resolved.source, "config.json")),
            _optional(cached_file(resolved.source, "generation_config.json", _raise_exceptions_for_missing_entries=False)),
        )
    config = read_json_object(paths[0])
    generation = read_json_object(paths[1]) if paths[1] is not None and paths[1].is_file() else None
    return config, generation


def _optional(p):
    return Path(p) if p else None


def read_json_object(path: Path, what: str = "a transformers config") -> dict:
    """A JSON object from ``path``, or a CheckpointError saying what is wrong with the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})", hint="the file must be valid UTF-8 JSON") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object", hint=f"the file is not {what}")
    return data


def cache_off_locations(config: dict, generation_config: dict | None) -> list[str]:
    """Every place the saved checkpoint switches the KV cache off, as ``file: key`` strings."""
    found = []
    if config.get("use_cache") is False:
        found.append("config.json: use_cache")
    text = config.get("text_config")
    if isinstance(text, dict) and text.get("use_cache") is False:
        found.append("config.json: text_config.use_cache")
    if generation_config is not None and generation_config.get("use_cache") is False:
        found.append("generation_config.json: use_cache")
    return found


def saved_cache_enabled(config: dict, generation_config: dict | None) -> bool:
    """Whether plain ``model.generate`` uses the cache for this checkpoint as saved: the generation
    config decides when present; otherwise it is derived from config.json (top level, then text_config)."""
    if generation_config is not None:
        return generation_config.get("use_cache", True) is not False
    if "use_cache" in config:
        return config["use_cache"] is not False
    text = config.get("text_config")
    return not (isinstance(text, dict) and text.get("use_cache") is False)


@dataclass(frozen=True)
class Runtime:
    device: str
    dtype: str
    attn: str
    notes: tuple[str, ...] = ()


def choose_runtime(
    device: str | None = None,
    dtype: str | None = None,
    attn: str | None = None,
    *,
    cuda_available: bool,
    flash_attn_available: bool,
    bf16_supported: bool = True,
) -> Runtime:
    """CUDA: bf16 + flash_attention_2 (sdpa, said aloud, when flash-attn is missing). CPU: float32 + sdpa.
    Explicit choices win; impossible ones are errors, not silent downgrades."""
    notes: list[str] = []
    device = (device or "auto").lower()
    if device == "auto":
        device = "cuda" if cuda_available else "cpu"
    if device.startswith("cuda") and not cuda_available:
        raise UsageError(f"--device {device}: CUDA is not available here", hint="use --device cpu, or check the driver and torch build")
    if not (device == "cpu" or device.startswith("cuda")):
        raise UsageError(f"--device {device}: unsupported", hint="use auto, cpu, cuda or cuda:N")
    on_cuda = device.startswith("cuda")

    if dtype in (None, "auto"):
        dtype = "float32" if not on_cuda else ("bfloat16" if bf16_supported else "float16")
        if on_cuda and not bf16_supported:
            notes.append("this GPU has no bf16; using float16")
    elif dtype.lower() in DTYPE_ALIASES:
        dtype = DTYPE_ALIASES[dtype.lower()]
    else:
        raise UsageError(f"--dtype {dtype}: unknown", hint="use auto, bfloat16, float16 or float32")

    if attn in (None, "auto"):
        if on_cuda and flash_attn_available and dtype != "float32":
            attn = "flash_attention_2"
        else:
            attn = "sdpa"
            if on_cuda and not flash_attn_available:
                notes.append("flash-attn is not installed: using sdpa (install it with: pip install 'vlmfast[gpu]')")
    elif attn not in ATTN_CHOICES:
        raise UsageError(f"--attn {attn}: unknown", hint=f"use auto, {', '.join(ATTN_CHOICES)}")
    elif attn == "flash_attention_2":
        if not on_cuda:
            raise UsageError("--attn flash_attention_2 needs a CUDA device", hint="use --attn sdpa on CPU")
        if dtype == "float32":
            raise UsageError("--attn flash_attention_2 works only in bfloat16/float16", hint="use --dtype bfloat16")
        if not flash_attn_available:
            raise UsageError("--attn flash_attention_2: flash-attn is not installed", hint="pip install 'vlmfast[gpu]', or use --attn sdpa")
    return Runtime(device=device, dtype=dtype, attn=attn, notes=tuple(notes))


def detect_runtime(device=None, dtype=None, attn=None) -> Runtime:
    """:func:`choose_runtime` with the capabilities of this machine."""
    import torch

    cuda = torch.cuda.is_available()
    return choose_runtime(
        device, dtype, attn,
        cuda_available=cuda,
        flash_attn_available=cuda and _imports("flash_attn"),
        bf16_supported=cuda and torch.cuda.is_bf16_supported(),
    )


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except Exception:  # a broken CUDA extension raises all sorts of things on import
        return False


@dataclass
class CacheReport:
    found_off: list[str]  # where the saved checkpoint switches the cache off
    saved_enabled: bool  # what plain generate would do with the checkpoint as saved
    forced_on: bool  # vlmfast generates with the cache on (always True after load)

    def as_dict(self) -> dict:
        return {"found_off": self.found_off, "saved_enabled": self.saved_enabled, "forced_on": self.forced_on}


@dataclass
class Loaded:
    """A model ready for :mod:`vlmfast.engine`, plus everything the report says about it."""

    model: object
    processor: object
    source: str
    runtime: Runtime
    cache: CacheReport
    eos_token_ids: list[int]
    pad_token_id: int
    suppress_token_ids: list[int]
    load_s: float
    notes: list[str] = field(default_factory=list)
    base_source: str | None = None  # LoRA adapter loads: the base (its config.json lives there, not in source)


def load(
    ckpt: str,
    *,
    device: str | None = None,
    dtype: str | None = None,
    attn: str | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    base: str | None = None,
    merge: bool = False,
) -> Loaded:
    """Load model + processor with the cache forced on and left padding. A LoRA adapter dir loads its
    base (``base``, else the one adapter_config.json names) plus the adapter, merged when ``merge``.
    Raises CheckpointError / UsageError with a hint for anything the user can fix."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own report is the interface; no per-file bars in CI logs
    start = time.perf_counter()
    resolved = resolve_checkpoint(ckpt, adapters=True)
    if resolved.kind == "adapter":
        from .lora import load_with_adapter

        loaded = load_with_adapter(resolved.source, base=base, merge=merge, device=device, dtype=dtype, attn=attn,
                                   trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)
        loaded.notes[:0] = [resolved.note] if resolved.note else []
        loaded.load_s = time.perf_counter() - start
        return loaded
    if base is not None or merge:
        raise UsageError("--base and --merge apply to LoRA adapter checkpoints", hint=f"{resolved.source} is a full model")
    if resolved.is_local and not allow_pickle and not any(Path(resolved.source).glob("*.safetensors")):
        raise CheckpointError(
            f"{resolved.source}: weights are pickle files (*.bin), which can run arbitrary code when loaded",
            hint="convert them to safetensors, or pass --allow-pickle if you trust where they came from",
        )
    runtime = detect_runtime(device, dtype, attn)
    notes = [n for n in (resolved.note,) if n] + list(runtime.notes)
    if trust_remote_code:
        notes.append("trust_remote_code is on: the checkpoint's own Python code runs")

    try:
        processor = AutoProcessor.from_pretrained(resolved.source, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise CheckpointError(
            f"{resolved.source}: cannot load the processor ({type(exc).__name__}: {exc})",
            hint="copy preprocessor_config.json, tokenizer and chat template files from the base model into the checkpoint",
        ) from exc
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None or not hasattr(processor, "image_processor"):
        raise CheckpointError(
            f"{resolved.source}: the processor has no tokenizer/image processor (got {type(processor).__name__})",
            hint="preprocessor_config.json is probably missing: copy it from the base model",
        )
    tokenizer.padding_side = "left"  # right padding breaks batched generation (transformers#36100)
    if getattr(processor, "chat_template", None) is None:
        from .tiny import CHAT_TEMPLATE

        processor.chat_template = CHAT_TEMPLATE
        notes.append("the checkpoint has no chat template: using vlmfast's ChatML template")

    try:
        model = AutoModelForImageTextToText.from_pretrained(
            resolved.source,
            dtype=getattr(torch, runtime.dtype),
            attn_implementation=runtime.attn,
            device_map={"": runtime.device} if runtime.device != "cpu" else None,
            trust_remote_code=trust_remote_code,
            use_safetensors=None if allow_pickle else True,
        )
    except Exception as exc:
        raise CheckpointError(
            f"{resolved.source}: cannot load the model ({type(exc).__name__}: {exc})",
            hint="check that the weights are complete and match config.json",
        ) from exc
    model.eval()
    vocab = getattr(model.config.get_text_config(), "vocab_size", None)
    if vocab and len(tokenizer) < vocab // 2:
        raise CheckpointError(
            f"{resolved.source}: the tokenizer knows {len(tokenizer)} tokens but the model's vocabulary has {vocab}",
            hint="tokenizer files (tokenizer.json, or vocab.json + merges.txt) are missing: copy them from the base model",
        )

    config, generation = read_configs(resolved)
    cache = CacheReport(cache_off_locations(config, generation), saved_cache_enabled(config, generation), True)
    if model.generation_config.use_cache is False and not cache.found_off:
        cache.found_off.append("model.generation_config.use_cache (as loaded)")
    model.generation_config.use_cache = True

    eos, eos_note = eos_list(model.generation_config.eos_token_id, tokenizer)
    if eos_note:
        notes.append(eos_note)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.generation_config.pad_token_id
    if pad is None:
        pad = eos[0]
    model_type = config.get("model_type", "")
    if model_type not in TESTED_MODEL_TYPES:
        notes.append(f"model_type {model_type!r} is not one vlmfast is tested on ({', '.join(TESTED_MODEL_TYPES)})")
    return Loaded(
        model=model,
        processor=processor,
        source=resolved.source,
        runtime=runtime,
        cache=cache,
        eos_token_ids=eos,
        pad_token_id=int(pad),
        suppress_token_ids=vision_placeholder_ids(model.config),
        load_s=time.perf_counter() - start,
        notes=notes,
    )


def eos_list(saved, tokenizer) -> tuple[list[int], str | None]:
    """The checkpoint's EOS ids plus ``<|im_end|>``: merged checkpoints that lost it run away."""
    ids = [saved] if isinstance(saved, int) else list(saved or [])
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    extra = [i for i in dict.fromkeys((im_end, tokenizer.eos_token_id))
             if isinstance(i, int) and i != tokenizer.unk_token_id and i not in ids]
    note = f"EOS list {ids} lacks {IM_END}: stopping on {ids + extra}" if im_end in extra else None
    return ids + extra, note


def vision_placeholder_ids(config) -> list[int]:
    """Image/video/vision start-end token ids: random or undertrained weights can emit them, which
    makes generate fail ("Image features and image tokens do not match"), so they are suppressed."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    ids = []
    for name in names:
        value = getattr(config, name, None)
        if value is None and hasattr(config, "get_text_config"):
            value = getattr(config.get_text_config(), name, None)
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    return ids
