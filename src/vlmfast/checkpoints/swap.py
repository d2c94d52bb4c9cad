"""Load once, swap weights: the next checkpoint of a run copied into the model already loaded.

Checkpoints of one training run share the architecture and every shape; only the numbers differ. When
the next one's config matches the loaded model's and each of its tensors has a home of the same shape,
its safetensors are copied into the loaded parameters in place: no new model object, no processor
reload, and CUDA graphs and compiled decode steps stay valid because the parameters' storage is reused.
Anything else (another architecture, a LoRA adapter, pickle weights, a tensor without a home, processor,
tokenizer or chat-template files other than the loaded ones) is a full load, and :func:`plan_swap` says why.

Trainers save under the layout their transformers version writes (``model.layers.*``, ``visual.*``)
while the loaded model names them ``model.language_model.*``, ``model.visual.*``: names are compared
in one normal form.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass
from pathlib import Path

from vlmfast.checkpoints.readers import (PROCESSOR_GROUP, TEMPLATE_FILES, TOKENIZER_FILES, cache_off_locations, read_configs,
                                        saved_cache_enabled, saved_eos)
from vlmfast.errors import VlmfastError

# what the processor, its tokenizer and the chat template are read from: a checkpoint whose files differ from
# the loaded ones prompts otherwise (another template, other special tokens, other image sizes), so it loads afresh
PROCESSING_FILES = (*PROCESSOR_GROUP, *TOKENIZER_FILES, *TEMPLATE_FILES)

# config keys that say nothing about the weights (what a trainer flips, or records about itself)
IGNORED_CONFIG_KEYS = frozenset({"use_cache", "_name_or_path", "transformers_version", "torch_dtype", "dtype",
                                 "architectures", "_attn_implementation_autoset"})


def normal_name(name: str) -> str:
    """A tensor's name with the layout differences between transformers versions taken out."""
    name = re.sub(r"^model\.language_model\.", "model.", name)
    return re.sub(r"^(model\.)?visual\.", "visual.", name)


@dataclass
class SwapPlan:
    """Which file tensor goes into which loaded tensor (None: a full load is needed, ``reason`` says why)."""

    files: dict[str, list[tuple[str, str]]] | None  # safetensors file → [(its tensor name, the model's name)]
    reason: str = ""
    nbytes: int = 0


def plan_swap(loaded, directory: Path) -> SwapPlan:
    """Whether the checkpoint in ``directory`` can be copied into ``loaded``'s model in place, and how."""
    from vlmfast.checkpoints.heads import saved_head
    from vlmfast.checkpoints.readers import maybe_json, safetensors_header
    from vlmfast.checkpoints.weight_files import loaded_safetensors

    directory = Path(directory)
    if loaded.base_source is not None or not loaded.config_dir:
        return SwapPlan(None, "the loaded model carries a LoRA adapter")
    files_loaded = loaded_safetensors(directory)  # what from_pretrained would read (a stale set aside)
    if not files_loaded or (directory / "adapter_config.json").is_file():
        return SwapPlan(None, "not a full safetensors checkpoint")
    from vlmfast.checkpoints.readers import weights_complete

    if not weights_complete(directory):  # a cut file: the full load names it (CheckpointError), a copy would crash
        return SwapPlan(None, "its weights are incomplete")
    if _weights_config(directory) != _weights_config(loaded.config_dir):
        return SwapPlan(None, "its config differs from the loaded model's (architecture, sizes or settings)")
    if (differing := processing_difference(Path(loaded.config_dir), directory)) is not None:
        return SwapPlan(None, differing)
    model = loaded.model
    state = model.state_dict()
    homes = {normal_name(name): name for name in state}
    files: dict[str, list[tuple[str, str]]] = {}
    filled, nbytes = set(), 0
    for file in files_loaded:
        for name, meta in safetensors_header(file).items():
            if name == "__metadata__":
                continue
            home = homes.get(normal_name(name))
            if home is None or list(state[home].shape) != list(meta["shape"]):
                return SwapPlan(None, f"tensor {name} has no place of the same shape in the loaded model")
            files.setdefault(file.name, []).append((name, home))
            filled.add(home)
            nbytes += meta["data_offsets"][1] - meta["data_offsets"][0]
    shares = _shares_head(model)
    head = saved_head(directory, maybe_json(directory / "config.json"), tied_by_class=True) if shares else None
    if head is not None and not head.equal:  # copied in place, it would overwrite the embedding it shares
        return SwapPlan(None, "it saves an LM head of its own while the loaded model's is tied to the embedding")
    tied = {name for name in state if name.endswith("lm_head.weight")} if shares else set()
    missing = [name for name in state if name not in filled and name not in tied]
    if missing:
        return SwapPlan(None, f"{len(missing)} of the loaded model's tensors are not in it (e.g. {missing[0]})")
    return SwapPlan(files, nbytes=nbytes)


def swap_into(loaded, found, plan: SwapPlan):
    """The :class:`~vlmfast.checkpoints.load.Loaded` of ``found`` (a located checkpoint), made by copying its
    tensors into ``loaded``'s model in place; what the report says about the checkpoint (cache, EOS list,
    source) is read from its own files. ``load_s`` is the swap's seconds."""
    import torch
    from safetensors import safe_open

    from vlmfast.checkpoints.generation_refused import ignored_notes, refuse_unloadable
    from vlmfast.checkpoints.load import CacheReport, eos_list

    refuse_unloadable(found.path)  # before a tensor is copied: the loaded model stays the last checkpoint's
    start = time.perf_counter()
    state = loaded.model.state_dict()
    device = next(iter(state.values())).device
    with torch.no_grad():
        for file, pairs in plan.files.items():
            with safe_open(str(found.path / file), framework="pt", device=str(device)) as f:
                for name, home in pairs:
                    state[home].copy_(f.get_tensor(name))
        # no tie_weights(): a head that shares the embedding's tensor got the new values with it, and one the
        # load left untied must stay so (re-tying would point a captured graph at memory that is freed)
    check_swapped(state, found.path, plan)
    _swap_generation_config(loaded.model, found.path)
    config, generation = read_configs(found.path)
    cache = CacheReport(cache_off_locations(config, generation), saved_cache_enabled(config, generation), True)
    eos, note = eos_list(saved_eos(config, generation)[0], loaded.processor.tokenizer)
    return dataclasses.replace(loaded, source=found.source, cache=cache, eos_token_ids=eos, config_dir=found.path,
                               load_s=time.perf_counter() - start,
                               notes=[n for n in (found.note, note) if n] + ignored_notes(generation, config))


class StaleSwap(VlmfastError):
    """After an in-place swap the model does not hold the checkpoint's weights (a copy that did not land)."""


def check_swapped(state: dict, directory: Path, plan: SwapPlan) -> None:
    """A few tensors read back from the checkpoint's files and compared with the model's after the copy
    (:func:`vlmfast.checkpoints.fingerprint.readback_mismatch`); :class:`StaleSwap` when one differs, so a stale
    swap is caught at the step it happened, before any of its rows is generated."""
    from vlmfast.checkpoints.fingerprint import readback_mismatch

    pairs = [(file, name, home) for file, names in plan.files.items() for name, home in names]
    wrong = readback_mismatch(state, directory, pairs)
    if wrong is not None:
        raise StaleSwap(f"after copying {directory} into the loaded model in place, {wrong}: the model still "
                        "holds other weights", hint="rerun the same command (finished checkpoints are kept); "
                        "this checkpoint's rows were not generated")


def _weights_config(directory: Path) -> dict:
    """The checkpoint's config as transformers reads it (defaults filled in, so saves by different
    transformers versions compare alike), less what says nothing about the weights."""
    from transformers import AutoConfig

    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in IGNORED_CONFIG_KEYS}
        return value

    return clean(AutoConfig.from_pretrained(str(directory)).to_dict())


def _shares_head(model) -> bool:
    """Whether the LM head and the input embedding are one tensor in the loaded model (what the load did,
    not what the config says)."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and embed is not None and head.weight is embed.weight


def _swap_generation_config(model, directory: Path) -> None:
    """The next checkpoint's generation config on the model (plain ``generate`` reads it), the cache forced
    on as at load."""
    from transformers import GenerationConfig

    if (Path(directory) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(directory))
    else:  # none saved: derived from its config.json, as a fresh load derives it (not the last checkpoint's)
        model.generation_config = GenerationConfig.from_model_config(model.config)
    model.generation_config.use_cache = True


def layout_difference(a: Path, b: Path) -> str | None:
    """Why checkpoint directory ``b``'s weights would not fit where ``a``'s are (config or tensor names and
    shapes differ, or either is not a full safetensors checkpoint); None when they would. Reads headers only."""
    from vlmfast.checkpoints.readers import safetensors_header

    shapes = []
    for directory in (a, b):
        files = sorted(Path(directory).glob("*.safetensors"))
        if not files or (Path(directory) / "adapter_config.json").is_file():
            return f"{directory} is not a full safetensors checkpoint"
        shapes.append({normal_name(name): (meta["dtype"], tuple(meta["shape"])) for f in files
                       for name, meta in safetensors_header(f).items() if name != "__metadata__"})
    if _weights_config(a) != _weights_config(b):
        return "its config differs from the running model's (architecture, sizes or settings)"
    if (differing := processing_difference(Path(a), Path(b))) is not None:
        return differing
    if shapes[0] != shapes[1]:
        differing = sorted(set(shapes[0].items()) ^ set(shapes[1].items()))
        return f"its tensors differ from the running model's (e.g. {differing[0][0]})"
    return None



def processing_difference(a: Path, b: Path) -> str | None:
    """Which processor, tokenizer or chat-template files of checkpoint ``b`` differ from ``a``'s (saved in one
    of them only, or with other bytes); None when they are the same."""
    def content(path: Path) -> bytes | None:
        return path.read_bytes() if path.is_file() else None

    differing = [name for name in PROCESSING_FILES if content(a / name) != content(b / name)]
    if not differing:
        return None
    return f"its processor, tokenizer or chat-template files differ from the loaded ones: {', '.join(differing)}"
