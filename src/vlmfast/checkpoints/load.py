"""Load a checkpoint for generation: pick device/dtype/attention, see where the KV cache was switched
off, load model + processor with the cache forced on and left padding.

``generate`` reads only ``generation_config.use_cache``, so the fix is to set it on the loaded model
*and* pass ``use_cache=True`` to every generate call. Finding the checkpoint is :mod:`vlmfast.checkpoints.locate`'s
job and reading its files :mod:`vlmfast.checkpoints.readers`'; this module is the only one that builds a model.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from dataclasses import dataclass, field
from pathlib import Path

from vlmfast.checkpoints.readers import cache_off_locations, read_configs, require_loadable, saved_cache_enabled, token_ids
from vlmfast.checkpoints.templates import CHAT_TEMPLATE, QWEN2_VL_CHAT_TEMPLATE
from vlmfast.errors import CheckpointError, UsageError
from vlmfast.checkpoints.families import CHAT_STOP, Family, family_of, untested_note
from vlmfast.checkpoints.locate import Located, locate, require
from vlmfast.checkpoints.portable import readable_here
from vlmfast.checkpoints.generation_refused import ignored_notes, refuse_unloadable
from vlmfast.checkpoints.runtime_choices import check_attn, check_device, check_dtype  # the options check them too


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
    flash_attn_problem: str | None = None,
    cuda_devices: int | None = None,
) -> Runtime:
    """CUDA: bf16 + flash_attention_2 (sdpa, said aloud, when flash-attn is missing). CPU: float32 + sdpa.
    Explicit choices win; impossible ones are errors, not silent downgrades. ``flash_attn_problem``: why an
    installed flash-attn cannot be used (it does not import, transformers refuses its version); ``cuda_devices``: how
    many CUDA devices torch sees (None: not checked)."""
    notes: list[str] = []
    missing = flash_attn_problem or "flash-attn is not installed"
    remedy = ("reinstall it for this torch: pip install --force-reinstall --no-deps flash-attn" if flash_attn_problem
              else "install it with: pip install 'vlmfast[gpu]'")
    device = check_device(device)
    if device == "auto":
        device = "cuda" if cuda_available else "cpu"
    if device.startswith("cuda") and not cuda_available:
        raise UsageError(f"--device {device}: CUDA is not available here", hint="use --device cpu, or check the driver and torch build")
    if device.startswith("cuda:") and cuda_devices is not None and int(device[5:]) >= cuda_devices:
        raise UsageError(f"--device {device}: this machine has {cuda_devices} CUDA device(s), cuda:0 to cuda:{cuda_devices - 1}",
                         hint="use one of them, or --device cuda; CUDA_VISIBLE_DEVICES renumbers the devices it keeps from 0")
    on_cuda = device.startswith("cuda")

    dtype = check_dtype(dtype)
    if dtype is None:
        dtype = "float32" if not on_cuda else ("bfloat16" if bf16_supported else "float16")
        if on_cuda and not bf16_supported:
            notes.append("this GPU has no bf16; using float16")

    check_attn(attn)
    if attn in (None, "auto"):
        if on_cuda and flash_attn_available and dtype != "float32":
            attn = "flash_attention_2"
        else:
            attn = "sdpa"
            if on_cuda and not flash_attn_available:
                notes.append(f"{missing}: using sdpa ({remedy})")
    elif attn == "flash_attention_2":
        if not on_cuda:
            raise UsageError("--attn flash_attention_2 needs a CUDA device", hint="use --attn sdpa on CPU")
        if dtype == "float32":
            raise UsageError("--attn flash_attention_2 works only in bfloat16/float16", hint="use --dtype bfloat16")
        if not flash_attn_available:
            raise UsageError(f"--attn flash_attention_2: {missing}", hint=f"{remedy}; or use --attn sdpa")
    return Runtime(device=device, dtype=dtype, attn=attn, notes=tuple(notes))


def detect_runtime(device=None, dtype=None, attn=None) -> Runtime:
    """:func:`choose_runtime` with the capabilities of this machine."""
    import torch

    cuda = torch.cuda.is_available()
    flash, problem = flash_attn_state() if cuda else (False, None)
    return choose_runtime(
        device, dtype, attn,
        cuda_available=cuda,
        flash_attn_available=flash,
        bf16_supported=cuda and torch.cuda.is_bf16_supported(),
        flash_attn_problem=problem,
        cuda_devices=torch.cuda.device_count() if cuda else None,
    )


def flash_attn_state() -> tuple[bool, str | None]:
    """Whether flash_attention_2 can run here (flash-attn imports, and transformers takes its version), and
    why not when flash-attn is installed: a build for another torch fails on import, and said only "not
    installed" a user would install it again and see nothing change."""
    if importlib.util.find_spec("flash_attn") is None:
        return False, None
    try:
        importlib.import_module("flash_attn")
    except Exception as exc:  # a broken CUDA extension raises all sorts of things on import
        first = (str(exc).splitlines() or [""])[0][:160]
        return False, f"flash-attn is installed but does not import ({type(exc).__name__}: {first})"
    try:
        from transformers.utils import is_flash_attn_2_available
    except ImportError:
        return True, None
    if not is_flash_attn_2_available():  # what from_pretrained checks: its version, a CUDA torch
        return False, "flash-attn is installed but transformers does not take it (its version, or this torch)"
    return True, None


@dataclass
class CacheReport:
    found_off: list[str]  # where the saved checkpoint switches the cache off
    saved_enabled: bool  # what plain generate would do with the checkpoint as saved
    forced_on: bool  # vlmfast generates with the cache on (always True after load)

    def as_dict(self) -> dict:
        return {"found_off": self.found_off, "saved_enabled": self.saved_enabled, "forced_on": self.forced_on}


@dataclass
class Loaded:
    """A model ready for :mod:`vlmfast.engines.hf.engine`, plus everything the report says about it."""

    model: object
    processor: object
    source: str
    runtime: Runtime
    cache: CacheReport
    eos_token_ids: list[int]
    pad_token_id: int
    suppress_token_ids: list[int]
    load_s: float
    config_dir: Path  # where config.json and generation_config.json live (a LoRA adapter's: its base's)
    notes: list[str] = field(default_factory=list)
    base_source: str | None = None  # LoRA adapter loads: the base model
    family: Family | None = None  # None: a model type vlmfast has not tested (runs with plain generate)


def load(
    ckpt: str | Located,
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
    Raises CheckpointError / UsageError with a hint for anything the user can fix; a wrong path fails
    before torch is imported."""
    start = time.perf_counter()
    found = ckpt if isinstance(ckpt, Located) else locate(ckpt, hub=True)
    found = require(found, "model", "adapter", "hub")
    if found.kind == "adapter":
        loaded = _load_with_adapter(found, base, merge, device=device, dtype=dtype, attn=attn,
                                    trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)
        loaded.load_s = time.perf_counter() - start
        return loaded
    if base is not None or merge:
        raise UsageError("--base and --merge apply to LoRA adapter checkpoints", hint=f"{found.source} is a full model")
    if found.is_local and found.kind == "model":  # a broken config.json or cut weights, named as such (not as
        require_loadable(found.path)  # the processor or the loader that reads them first), before torch loads
    if found.is_local and not allow_pickle and not any(found.path.glob("*.safetensors")):
        raise CheckpointError(
            f"{found.path}: weights are pickle files (*.bin), which can run arbitrary code when loaded",
            hint="convert them to safetensors, or pass --allow-pickle if you trust where they came from",
        )
    loaded = _load_model(found, detect_runtime(device, dtype, attn), trust_remote_code, allow_pickle)
    loaded.load_s = time.perf_counter() - start
    return loaded


def _load_model(found: Located, runtime: Runtime, trust_remote_code: bool, allow_pickle: bool) -> Loaded:
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own report is the interface; no per-file bars in CI logs
    source = found.source
    from vlmfast.checkpoints.readers import tokenizer_files_whole

    if found.is_local and found.kind == "model" and not tokenizer_files_whole(found.path):  # loads, with wrong ids
        raise CheckpointError(f"{source}: the tokenizer files are not whole: no tokenizer.json, and vocab.json + "
                              "merges.txt alone give the special tokens other ids (or none) in this save",
                              hint="copy tokenizer.json (and the other tokenizer files) from the base model "
                                   "(vlmfast fix CKPT --processor-from BASE does it)")
    notes = [n for n in (found.note,) if n and n != "hub id"] + list(runtime.notes)
    if found.is_local:  # values transformers refuses to load the model with: said before it tries
        refuse_unloadable(found.path)
    if trust_remote_code:
        notes.append("trust_remote_code is on: the checkpoint's own Python code runs")
    # a checkpoint saved by transformers 5, on 4.x: read through a rewritten temporary copy (portable.py)
    with readable_here(found.path) if found.is_local else contextlib.nullcontext((source, [])) as (here, said):
        notes += said
        processor, said = load_processor(str(here), trust_remote_code=trust_remote_code,
                                         hint="copy preprocessor_config.json, tokenizer and chat template files from the "
                                              "base model into the checkpoint (vlmfast fix CKPT --processor-from BASE does it)")
        notes += said
        try:
            model = AutoModelForImageTextToText.from_pretrained(
                str(here),
                dtype=getattr(torch, runtime.dtype),
                attn_implementation=runtime.attn,
                device_map={"": runtime.device} if runtime.device != "cpu" else None,
                trust_remote_code=trust_remote_code,
                use_safetensors=None if allow_pickle else True,
            )
        except Exception as exc:
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""  # not the list of every known class
            raise CheckpointError(
                f"{source}: cannot load the model ({type(exc).__name__}: {said[:300]})",
                hint="check that the weights are complete and match config.json (its model_type: a Qwen-VL family)",
            ) from exc
    tokenizer = processor.tokenizer
    model.eval()
    from vlmfast.checkpoints.heads import untie_saved_head

    if (said := untie_saved_head(model, found)) is not None:  # a saved head the config ties: run the trainer's
        notes.append(said)
    vocab = getattr(model.config.get_text_config(), "vocab_size", None)
    if vocab and len(tokenizer) < vocab // 2:
        raise CheckpointError(
            f"{source}: the tokenizer knows {len(tokenizer)} tokens but the model's vocabulary has {vocab}",
            hint="tokenizer files (tokenizer.json, or vocab.json + merges.txt) are missing: copy them from the base model",
        )
    patch = getattr(getattr(processor, "image_processor", None), "patch_size", None)
    want = getattr(getattr(model.config, "vision_config", None), "patch_size", None)
    if isinstance(patch, int) and isinstance(want, int) and patch != want:  # another family's processor files
        raise CheckpointError(f"{source}: the image processor cuts {patch}-pixel patches but the vision tower takes {want}: "
                              "image tokens would not match the image features",
                              hint="copy the processor files from the base model the run was trained from "
                                   "(vlmfast fix CKPT --processor-from BASE; vlmfast doctor CKPT names the mismatch)")

    config_dir = found.path if found.is_local else _snapshot_dir(source)
    config, generation = read_configs(config_dir)
    notes += ignored_notes(generation, config)  # values plain generate refuses that vlmfast does not apply
    cache = CacheReport(cache_off_locations(config, generation), saved_cache_enabled(config, generation), True)
    if model.generation_config.use_cache is False and not cache.found_off:
        cache.found_off.append("model.generation_config.use_cache (as loaded)")
    model.generation_config.use_cache = True

    family = family_of(config)
    eos, eos_note = eos_list(model.generation_config.eos_token_id, tokenizer, family)
    if eos_note:
        notes.append(eos_note)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.generation_config.pad_token_id
    if pad is None:
        pad = eos[0]
    if family is None:
        notes.append(untested_note(config.get("model_type")))
    return Loaded(
        model=model, processor=processor, source=source, runtime=runtime, cache=cache, eos_token_ids=eos,
        pad_token_id=int(pad), suppress_token_ids=vision_placeholder_ids(model.config, tokenizer, family), load_s=0.0,
        config_dir=config_dir, notes=notes, family=family,
    )


def saved_generation_config(model_dir, config):
    """The GenerationConfig transformers' model load gives ``model_dir`` (``config``: its model config): its
    generation_config.json (InputError first for a value transformers refuses to load), else one derived from
    ``config`` (no such file, as transformers derives it)."""
    from transformers import GenerationConfig

    if Path(model_dir).is_dir():
        refuse_unloadable(model_dir)
    try:
        return GenerationConfig.from_pretrained(model_dir)
    except OSError:  # no generation_config.json: generate derives one from config.json
        return GenerationConfig.from_model_config(config)


def _load_with_adapter(found: Located, base: str | None, merge: bool, **load_kwargs) -> Loaded:
    """The base (``base``, else the one adapter_config.json names) loaded as any checkpoint, then the
    adapter applied with peft. The processor is the adapter dir's own when it has one, else the base's.
    ``source`` is the adapter dir and ``base_source`` the base."""
    from vlmfast.checkpoints.lora import has_own_processor, load_adapter_model, locate_base, require_adapter_whole

    adapter_dir = found.path
    require_adapter_whole(adapter_dir)  # a cut adapter file: said before the base loads
    base_found = locate_base(adapter_dir, base)  # a full model or a hub id, not another adapter
    loaded = load(base_found, **load_kwargs)
    loaded.base_source = loaded.source
    loaded.model = load_adapter_model(loaded.model, adapter_dir, merge)
    loaded.model.generation_config.use_cache = True  # merge_and_unload keeps it; say it anyway
    how = "merged into the weights" if merge else "unmerged (LoRA layers kept)"
    loaded.notes[:0] = [found.note] if found.note else []
    loaded.notes.append(f"LoRA adapter {adapter_dir} on base {loaded.source}, {how}")
    if has_own_processor(adapter_dir):
        processor, _ = load_processor(str(adapter_dir), trust_remote_code=load_kwargs.get("trust_remote_code", False),
                                      hint="remove the broken processor files from the adapter dir to use the base's",
                                      template=loaded.processor.chat_template)
        loaded.processor = processor
        loaded.notes.append("processor from the adapter dir")
    else:
        loaded.notes.append("processor from the base (the adapter dir has none)")
    loaded.source = str(adapter_dir)
    return loaded


def _snapshot_dir(repo_id: str) -> Path:
    """The local snapshot directory of a hub model that from_pretrained has just fetched."""
    from transformers.utils import cached_file

    return Path(cached_file(repo_id, "config.json")).parent


def load_processor(path, *, trust_remote_code: bool, hint: str, template: str | None = None):
    """The checkpoint's processor, ready for batched generation: left padding (right padding breaks
    batched generation with flash-attn and shifts outputs), and a chat template (``template``, else
    vlmfast's ChatML one, said in the returned notes) when the checkpoint lost its own."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot load the processor ({type(exc).__name__}: {exc})", hint=hint) from exc
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None or not hasattr(processor, "image_processor"):
        raise CheckpointError(f"{path}: the processor has no tokenizer/image processor (got {type(processor).__name__})",
                              hint="preprocessor_config.json / processor_config.json is missing: " + hint)
    tokenizer.padding_side = "left"
    notes = []
    own = getattr(tokenizer, "chat_template", None)  # an older save keeps it in tokenizer_config.json only
    if getattr(processor, "chat_template", None) is None and template is None and isinstance(own, str) and own:
        processor.chat_template = own  # the checkpoint's own: the processor does not read it from there
        notes.append("the chat template is the tokenizer's (tokenizer_config.json): the processor has none of its own")
    if getattr(processor, "chat_template", None) is None:
        # Qwen2-VL and Qwen2.5-VL: their released template, whose default system turn the run was trained with
        released = type(processor).__name__ in ("Qwen2VLProcessor", "Qwen2_5_VLProcessor")
        processor.chat_template = template or (QWEN2_VL_CHAT_TEMPLATE if released else CHAT_TEMPLATE)
        if template is None:
            notes.append("the checkpoint has no chat template: using " + (
                "Qwen2-VL's released one (with its default system turn, \"You are a helpful assistant.\")" if released
                else "vlmfast's ChatML template") + "; copy the base model's if the run used another")
    return processor, notes


def eos_list(saved, tokenizer, family: Family | None = None) -> tuple[list[int], str | None]:
    """The checkpoint's EOS ids plus the family's chat stop (``<|im_end|>``; its id is the
    tokenizer's): merged checkpoints that lost it run away."""
    ids = token_ids(saved)
    text = [v for v in (saved if isinstance(saved, (list, tuple)) else [saved]) if v is not None and v not in ids]
    stop = family.chat_stop if family else CHAT_STOP
    stop_id = tokenizer.convert_tokens_to_ids(stop)
    extra = [i for i in dict.fromkeys((stop_id, tokenizer.eos_token_id))
             if isinstance(i, int) and i != tokenizer.unk_token_id and i not in ids]
    note = f"EOS list {ids} lacks {stop}: stopping on {ids + extra}" if stop_id in extra else None
    if text:  # what plain generate would be handed as ids
        note = f"eos_token_id holds {', '.join(map(repr, text))}, not token ids: left out" + (f"; {note}" if note else "")
    return ids + extra, note


def vision_placeholder_ids(config, tokenizer=None, family: Family | None = None) -> list[int]:
    """Vision placeholder ids — the family's placeholder tokens (by the tokenizer) and the image/video
    (start, end) token ids the config names: random or undertrained weights can emit them, which
    makes generate fail ("Image features and image tokens do not match"), so they are suppressed."""
    ids = []
    if family is not None and tokenizer is not None:
        found = (tokenizer.convert_tokens_to_ids(t) for t in family.vision_tokens)
        ids = [i for i in found if isinstance(i, int) and i != tokenizer.unk_token_id]
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
             "image_start_token_id", "image_end_token_id", "video_start_token_id", "video_end_token_id")
    for name in names:
        value = getattr(config, name, None)
        if value is None and hasattr(config, "get_text_config"):
            value = getattr(config.get_text_config(), name, None)
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    return ids
