"""Pure readers of a checkpoint directory's files: JSON configs, special-token ids, the saved EOS list,
where the KV cache is switched off, safetensors headers, adapter configs.

No torch, no transformers, no other vlmfast module but errors and the family table: the loader, doctor,
fix and LoRA code all read checkpoints through here, so reading a config costs a file read and nothing more.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from vlmfast.errors import CheckpointError
from vlmfast.checkpoints.families import CHAT_STOP, family_of
from vlmfast.checkpoints.weight_files import loaded_safetensors, names_read_by_v4, require_one_set

IM_END = CHAT_STOP
ADAPTER_CONFIG = "adapter_config.json"
PROCESSOR_CONFIGS = ("preprocessor_config.json", "processor_config.json")
PROCESSOR_GROUP = (*PROCESSOR_CONFIGS, "video_preprocessor_config.json")
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json")
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
NOT_WEIGHTS = ("training_args.bin",)  # HF Trainer pickles its arguments into every checkpoint-N

def read_json_object(path: Path, what: str = "a transformers config") -> dict:
    """A JSON object from ``path``, or a CheckpointError saying what is wrong with the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: missing", hint=f"the checkpoint directory must hold {Path(path).name}") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})", hint="the file must be valid UTF-8 JSON") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object", hint=f"the file is not {what}")
    return data


def maybe_json(path: Path) -> dict:
    """The JSON object in ``path``, or {} when it is absent or unreadable (for optional files)."""
    try:
        return read_json_object(path) if Path(path).is_file() else {}
    except CheckpointError:
        return {}


def read_configs(directory: Path) -> tuple[dict, dict | None]:
    """Raw config.json and generation_config.json (None when absent), exactly as saved."""
    d = Path(directory)
    generation = d / "generation_config.json"
    return read_json_object(d / "config.json"), read_json_object(generation) if generation.is_file() else None


# -- what the directory holds --------------------------------------------------------------------
def has_weights(directory: Path) -> bool:
    """Full-model weights (a LoRA ``adapter_model.*`` or HF Trainer's ``training_args.bin`` alone does not count)."""
    return any(not p.name.startswith("adapter_model") and p.name not in NOT_WEIGHTS
               for pattern in WEIGHT_GLOBS for p in Path(directory).glob(pattern))


def is_adapter_dir(path) -> bool:
    """True if ``path`` is a directory holding a PEFT ``adapter_config.json``."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_config(path) -> dict:
    """The adapter's ``adapter_config.json`` (CheckpointError when unreadable)."""
    return read_json_object(Path(path) / ADAPTER_CONFIG, "a PEFT adapter config")


def adapter_base_or_none(path) -> str | None:
    """``base_model_name_or_path`` from adapter_config.json, or None when absent or unreadable."""
    try:
        base = adapter_config(path).get("base_model_name_or_path")
    except CheckpointError:
        return None
    return base if isinstance(base, str) and base else None


def has_processor_config(d: Path) -> bool:
    # transformers 4.x writes preprocessor_config.json; 5.x nests the image processor in processor_config.json.
    return (Path(d) / "preprocessor_config.json").is_file() or "image_processor" in maybe_json(Path(d) / "processor_config.json")


def has_chat_template(d: Path) -> bool:
    d = Path(d)
    if any((d / f).is_file() for f in TEMPLATE_FILES):
        return True
    return any(maybe_json(d / f).get("chat_template") for f in ("tokenizer_config.json", *PROCESSOR_CONFIGS))


def tokenizer_files_whole(d: Path) -> bool:
    """Whether the tokenizer files load with the special tokens at their ids: ``tokenizer.json``; or ``vocab.json`` +
    ``merges.txt`` with the special tokens' ids listed (tokenizer_config.json's ``added_tokens_decoder``, which
    transformers 5 no longer writes, or ``added_tokens.json``): without them ``<|im_end|>`` gets another token's id.
    Never for Qwen3.5, whose tokenizer reads ``tokenizer.json`` alone."""
    d = Path(d)
    if (d / "tokenizer.json").is_file():
        return True
    if not ((d / "vocab.json").is_file() and (d / "merges.txt").is_file()):
        return False
    family = family_of(maybe_json(d / "config.json"))
    if family is not None and family.vocabulary != "qwen2":
        return False
    return bool(maybe_json(d / "tokenizer_config.json").get("added_tokens_decoder") or maybe_json(d / "added_tokens.json"))


def token_id(d: Path, token: str) -> int | None:
    """A special token's id from the tokenizer files (no tokenizer is loaded)."""
    d = Path(d)
    for entry in maybe_json(d / "tokenizer.json").get("added_tokens", []):
        if isinstance(entry, dict) and entry.get("content") == token:
            return entry.get("id")
    for key, entry in maybe_json(d / "tokenizer_config.json").get("added_tokens_decoder", {}).items():
        if isinstance(entry, dict) and entry.get("content") == token and key.isdigit():
            return int(key)
    value = maybe_json(d / "added_tokens.json").get(token)
    return value if isinstance(value, int) else None


# -- what the configs say ------------------------------------------------------------------------
def saved_eos(config: dict, generation: dict | None) -> tuple[list[int], str]:
    """The EOS ids plain generate stops on, and where they come from (``file: key``); :func:`saved_eos_not_ids`
    says what else the setting holds (a token written as text, ``"<|im_end|>"``, is no id)."""
    values, where = _saved_eos_values(config, generation)
    return token_ids(values), where


def saved_eos_not_ids(config: dict, generation: dict | None) -> list:
    values = _saved_eos_values(config, generation)[0]
    return [v for v in values if v not in token_ids(values)]


def token_ids(values) -> list[int]:
    """The integer token ids among ``values`` (one value or a list)."""
    values = values if isinstance(values, (list, tuple)) else [] if values is None else [values]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _saved_eos_values(config: dict, generation: dict | None) -> tuple[list, str]:
    """A generation_config.json, when there is one, is all plain generate reads (transformers 4.57 and 5 load it
    and take nothing of config.json's EOS into it): one without ``eos_token_id`` stops on nothing. Without the
    file, generate builds its settings from config.json."""
    sources = ((("generation_config.json: eos_token_id", generation),) if isinstance(generation, dict) else
               (("config.json: eos_token_id", config), ("config.json: text_config.eos_token_id", config.get("text_config"))))
    for where, data in sources:
        if isinstance(data, dict) and data.get("eos_token_id") is not None:
            value = data["eos_token_id"]
            return (value if isinstance(value, list) else [value]), where
    return [], "generation_config.json: eos_token_id"


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


def saved_cache_enabled(config: dict, generation_config: dict | None, transformers_version: str | None = None) -> bool:
    """Whether plain ``model.generate`` uses the cache for this checkpoint as saved, under ``transformers_version``
    (default: the one installed). The generation config decides when present. Otherwise transformers derives it
    from config.json: 5.x from the top level when it has the key, else from text_config; 4.x fills a top-level
    value equal to the default (true) from text_config, so a false in either place turns the cache off."""
    if generation_config is not None:
        return generation_config.get("use_cache", True) is not False
    text = config.get("text_config")
    top, inner = config.get("use_cache"), text.get("use_cache") if isinstance(text, dict) else None
    from vlmfast.checkpoints.families import installed_transformers, version_tuple

    major = (version_tuple(transformers_version) if transformers_version else installed_transformers() or (5,))[0]
    if major < 5:
        return top is not False and inner is not False
    return top is not False if "use_cache" in config else inner is not False


def saved_cache_report(found) -> dict:
    """Where a located checkpoint, as saved, has the KV cache off, and whether plain ``generate`` would
    use it (a hub id or an adapter: nothing read here, nothing found)."""
    config, generation = read_configs(found.path) if found is not None and found.kind == "model" else ({}, None)
    return {"found_off": cache_off_locations(config, generation), "saved_enabled": saved_cache_enabled(config, generation)}


def text_setting(config: dict, key: str):
    """A language-model setting, top level first, then ``text_config`` (flat and nested layouts)."""
    text = config.get("text_config")
    return config.get(key, text.get(key) if isinstance(text, dict) else None)


def chat_stop(d: Path, config: dict, base: Path | None = None) -> tuple[str, int | None]:
    """The token that ends a chat turn in this checkpoint's family (``<|im_end|>``) and its id: from the
    tokenizer files, else the base's, else the family's released vocabulary when ``vocab_size`` is that
    vocabulary's (the id differs per family: 151645 in Qwen2 to Qwen3-VL, 248046 in Qwen3.5)."""
    family = family_of(config)
    stop = family.chat_stop if family else CHAT_STOP
    found = token_id(d, stop)
    if found is None and base is not None:
        found = token_id(base, stop)
    if found is None and family is not None:
        found = family.real_token_id(stop, text_setting(config, "vocab_size"))
    return stop, found


def family_eos(d: Path, config: dict, eos: list[int], stop_id: int) -> list[int]:
    """``eos`` completed to the EOS list the family's base model ships (``<|im_end|>``, ``<|endoftext|>``
    for the Qwen families, ids by this tokenizer), then what ``eos`` has beyond it; for a model type the
    table does not know, the chat stop first, then ``eos``. Ids of ``eos`` outside the model's vocabulary
    (a list copied from another model) are dropped: no step can emit them."""
    family = family_of(config)
    vocab = text_setting(config, "vocab_size")
    eos = [i for i in eos if not isinstance(vocab, int) or 0 <= i < vocab]
    if family is None:
        return [stop_id] + [i for i in eos if i != stop_id]

    def resolved(token: str) -> int | None:
        found = stop_id if token == family.chat_stop else token_id(d, token)
        return found if found is not None else family.real_token_id(token, vocab)

    base = [i for i in dict.fromkeys(resolved(t) for t in family.eos_tokens) if isinstance(i, int)]
    return base + [i for i in eos if i not in base]


# -- weights -------------------------------------------------------------------------------------
def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file: tensor name → dtype, shape, data_offsets. Reads no tensors."""
    return _safetensors_head(path)[1]


def safetensors_length(path: Path) -> int:
    """The byte length the file has once fully written: the 8-byte header size, the header, and the
    data up to the end offset of its last tensor. Raises (OSError, ValueError) on an unreadable header."""
    size, header = _safetensors_head(path)
    ends = [int(meta["data_offsets"][1]) for name, meta in header.items() if name != "__metadata__"]
    return 8 + size + max(ends, default=0)


def _safetensors_head(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size < 2**27:
            raise ValueError(f"implausible header size {size}")
        header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    return size, header


def tensor_index(d: Path) -> dict[str, tuple[str, list[int], int]]:
    """name → (dtype, shape, bytes) over the full-model safetensors files transformers loads from the dir
    (:func:`vlmfast.checkpoints.weight_files.loaded_files`: a stale set beside them is not counted)."""
    index = {}
    named = names_read_by_v4(Path(d))
    for file in loaded_safetensors(d):
        if not file.is_file():
            continue  # a shard the index names and the dir lacks: incomplete_weights says so
        for name, meta in safetensors_header(file).items():
            if name != "__metadata__" and (named is None or name in named):
                index[name] = (meta["dtype"], meta["shape"], meta["data_offsets"][1] - meta["data_offsets"][0])
    return index


# -- is it fully written? ------------------------------------------------------------------------
def weights_complete(path) -> bool:
    """True once a checkpoint dir's weights are fully written (for watching a run that is still saving).

    A model dir: config.json, and weights whose every file is complete — each shard that
    ``*.index.json`` names exists, shards named ``-0000i-of-0000n`` have their index (written last),
    and each ``.safetensors`` file is at least as long as its header says (8-byte length + header + end
    offset of its last tensor). ``.bin`` files cannot be checked without unpickling: non-empty counts.
    An adapter dir: its ``adapter_model.safetensors`` (or ``.bin``) complete."""
    d = Path(path)
    if (d / "config.json").is_file() and has_weights(d):
        return _model_weights_complete(d)
    if is_adapter_dir(d):
        return incomplete_adapter(d) is None
    return False


def incomplete_adapter(d) -> str | None:
    """What keeps an adapter dir's weights from being whole (None when they are): its
    ``adapter_model.safetensors`` (else ``adapter_model.bin``) absent, empty, or shorter than its header says."""
    st = Path(d) / "adapter_model.safetensors"
    path = st if st.is_file() else Path(d) / "adapter_model.bin"
    why = _file_problem(path)
    if why == "missing":
        return "no adapter weights (adapter_model.safetensors or adapter_model.bin)"
    return f"{path.name}: {why}" if why else None


def require_loadable(d: Path) -> None:
    """A model dir's configs read (:func:`read_configs`), one set of weights in it and those complete
    (:func:`weights_complete`), or
    the CheckpointError naming what is wrong: checked from the files alone, in well under a second, before
    torch is imported (loading would fail on them only after that, with the error of whatever read them first)."""
    read_configs(d)
    require_one_set(d)  # model.safetensors beside a sharded set: transformers would run the single file unsaid
    said = incomplete_said(Path(d))
    if said is not None:
        raise CheckpointError(f"{d}: {said}",
                              hint="the save was cut short or is still being written: save again, or point at the "
                                   "run directory (its highest complete checkpoint is used); vlmfast doctor shows more")


_SHARD = re.compile(r"-\d+-of-\d+\.safetensors$")


def _model_weights_complete(d: Path) -> bool:
    return not incomplete_weights(d)


def incomplete_weights(d: Path) -> list[str]:
    """What keeps a model dir's weights from being whole, one line per file (empty when they are): a shard
    the index names that is not there, a file shorter than its header says, shards without their index."""
    d = Path(d)
    indexes = sorted(d.glob("*.safetensors.index.json")) + sorted(d.glob("*.bin.index.json"))
    said = []
    for index in indexes:
        weight_map = maybe_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            said.append(f"{index.name}: no weight_map")
            continue
        for name in sorted({n for n in weight_map.values() if isinstance(n, str)}):
            if not (d / name).exists():
                said.append(f"{name}: missing (named by {index.name})")
    files = [p for pattern in ("*.safetensors", "*.bin") for p in d.glob(pattern)
             if not p.name.startswith("adapter_model") and p.name not in NOT_WEIGHTS]
    if any(_SHARD.search(p.name) for p in files) and not any(i.name.endswith(".safetensors.index.json") for i in indexes):
        said.append("model.safetensors.index.json: missing (save_pretrained writes it after the last shard)")
    said += [f"{p.name}: {why}" for p in sorted(files) if (why := _file_problem(p))]
    if not (files or indexes):
        said.append("no weight files")
    return said


def incomplete_said(d: Path) -> str | None:
    """"the weights are incomplete: …" naming the files (:func:`incomplete_weights`), or None when they are whole."""
    problems = incomplete_weights(d)
    more = f"; and {len(problems) - 4} more" if len(problems) > 4 else ""
    return f"the weights are incomplete: {'; '.join(problems[:4])}{more}" if problems else None


def _file_complete(p: Path) -> bool:
    return _file_problem(p) is None


def _file_problem(p: Path) -> str | None:
    """Why a weight file is not whole (None when it is): absent, empty, shorter than its header says."""
    try:
        size = p.stat().st_size
        if p.suffix != ".safetensors":
            return None if size > 0 else "empty"
        want = safetensors_length(p)
        return None if size >= want else f"{size:,} of the {want:,} bytes its header says"
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return _header_problem(p)


CORRUPT = "a corrupt file: save it again"


def _header_problem(p: Path) -> str:
    """Why a safetensors header does not read: cut short (the file ends inside it: a save still being written)
    or corrupt (all its bytes are there and are not a safetensors header)."""
    try:
        with open(p, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
        size = p.stat().st_size
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if size >= 8 and not 0 < length < 2**27:
        return f"not a safetensors file: its first 8 bytes are no header length ({CORRUPT})"
    if size < 8 + length:
        return "its header cannot be read (cut short, or still being written)"
    return f"its header is not valid safetensors JSON though every byte of it is there ({CORRUPT})"


def corrupt_weights(d: Path) -> list[str]:
    """The lines of :func:`incomplete_weights` that no further writing can mend (a file whose header bytes are
    all there and are not a safetensors header): a run being watched does not wait for them."""
    return [said for said in incomplete_weights(d) if CORRUPT in said]
