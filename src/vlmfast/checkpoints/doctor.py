"""Checkpoint findings: what a trainer left in a checkpoint that makes inference slow, wrong or unsafe.

:func:`diagnose` reads files only (JSON configs, safetensors headers; no tensors) and returns
:class:`Finding` objects, each with a stable ``code`` and the exact ``fix``. Trainer output dirs are
found as ``--ckpt`` is (:func:`vlmfast.checkpoints.locate.locate`). Local directories only. Config-level checks import
neither torch nor transformers; the whole-weights check builds the model class on the meta device (no
memory, no weights read: :mod:`vlmfast.checkpoints.weights`).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from vlmfast.checkpoints.readers import (
    NOT_WEIGHTS, PROCESSOR_CONFIGS, adapter_base_or_none, adapter_config, cache_off_locations, chat_stop, family_eos,
    has_chat_template, has_processor_config, maybe_json, read_json_object, saved_eos, saved_eos_not_ids, tensor_index,
    incomplete_said, saved_cache_enabled, tokenizer_files_whole,
)
from vlmfast.checkpoints.weight_files import fsdp_sharded_said, shards_said
from vlmfast.checkpoints.families import (FAMILIES, classes_in_every_version, family_of, installed_transformers,
                                         untested_note, version_tuple)
from vlmfast.checkpoints.config_family import as_saved
from vlmfast.checkpoints.findings import (CODES, SEVERITIES, Finding, findings_as_dicts,  # noqa: F401 - importable here
                                          strict_exit_code)
from vlmfast.checkpoints.weight_findings import adapter_findings, vocab_findings, whole_findings
from vlmfast.checkpoints.generation_values import generation_value_findings
from vlmfast.checkpoints.locate import HUB_ID, Located, fsdp_merge_hint, fsdp_sharded_dir, locate, require
from vlmfast.errors import CheckpointError

FLOAT32_MIN_BYTES = 256 * 2**20  # below this, float32 storage costs too little to mention
# Classes transformers renamed or never had, and what the checkpoint should say instead.
RENAMED = {"Qwen2_5_VLImageProcessor": "Qwen2VLImageProcessor"}
# Exported by every transformers vlmfast supports (4.57 and 5.x; the Fast names as aliases in 5.x):
# checking these needs no import of transformers, which costs seconds (on 4.57 it imports torch).
ALWAYS_KNOWN = classes_in_every_version() | {"Qwen2VLImageProcessorFast", "Qwen2TokenizerFast"}


def diagnose(ckpt, base=None, *, float32_min_bytes: int = FLOAT32_MIN_BYTES, evaluation: dict | None = None) -> list[Finding]:
    """Every finding for the checkpoint at ``ckpt`` (a local model, trainer output or adapter dir),
    errors first. ``base`` (a local dir) adds comparisons: EOS list, vocabulary, tied embeddings,
    float32 vs a 16-bit base. Float32 storage is otherwise reported from ``float32_min_bytes`` on.
    ``evaluation`` (setting → (value, source), :func:`vlmfast.run.parity.evaluation_settings`) adds the
    settings that differ from the training configuration beside the checkpoint."""
    try:
        target = locate(ckpt)  # hub ids and missing paths: CheckpointError with a hint
    except CheckpointError:
        if (sharded := fsdp_sharded_dir(ckpt)) is None:
            raise
        return _fsdp_sharded(Path(str(ckpt)).expanduser(), sharded)
    base_dir = _base_dir(base) if base is not None else None
    d = target.path
    found: list[Finding] = []
    if target.note:
        found.append(Finding("info", "resolved", str(d), target.note, ""))
    if target.kind == "adapter":
        return _ordered(found + _adapter(d, base) + adapter_findings(d) + _parity(d, evaluation) + _trainer_leftovers(d))
    config = read_json_object(d / "config.json")
    generation = read_json_object(d / "generation_config.json") if (d / "generation_config.json").is_file() else None
    base_cfg = read_json_object(base_dir / "config.json") if base_dir else None
    found += _cache(d, config, generation)
    found += _eos(d, config, generation, base_dir, base_cfg)
    found += _generation_missing(d, config, generation, base_dir)
    found += generation_value_findings(config, generation, _fix_cmd(d))  # values plain generate trips on
    found += _files(d, base_dir) + _saved_by_v5(d)
    found += _family(d, as_saved(d, config)) + _classes(d)  # the processor against the family the weights are
    found += _weights(target, base_dir, float32_min_bytes)
    found += whole_findings(target, config, base_dir)
    found += _remote_code(d)
    found += vocab_findings(d, config, base_dir, base_cfg)
    found += _parity(d, evaluation) + _trainer_leftovers(d)
    return _ordered(found)


def doctor_target(ckpt) -> Path:
    """The directory doctor diagnoses: the one locate finds, or an FSDP sharded save (:func:`fsdp_sharded_dir`)."""
    try:
        return locate(ckpt).path
    except CheckpointError:
        if (sharded := fsdp_sharded_dir(ckpt)) is None:
            raise
        return sharded


def _fsdp_sharded(path: Path, d: Path) -> list[Finding]:
    what, how = fsdp_sharded_said(d)
    found = [Finding("error", "weights-missing", str(d), what, how)]
    if d != path:
        found.append(Finding("info", "resolved", str(d), f"using {d.relative_to(path).as_posix()} (highest checkpoint-N; "
                             "none holds config.json and weights)", ""))
    return _ordered(found + _trainer_leftovers(d))


def _ordered(found: list[Finding]) -> list[Finding]:
    # stable: check order within a severity, but the shards' merge first: the merger writes config files the fixes edit
    return sorted(found, key=lambda f: (SEVERITIES.index(f.severity), f.code != "fsdp-unmerged"))


def _base_dir(base) -> Path:
    return require(locate(base, option="--base"), "model", "fsdp", "incomplete").path  # a base to compare with, not an adapter


def _fix_cmd(d: Path, base: Path | None = None) -> str:
    fixed = d if os.access(d, os.W_OK) else d.with_name(d.name + "-fixed")  # read-only: fix refuses; fix a copy
    cmd = ("" if fixed == d else f"cp -r {shlex.quote(str(d))} {shlex.quote(str(fixed))} && ") + \
        f"vlmfast fix {shlex.quote(str(fixed))}"
    return cmd + (f" --processor-from {shlex.quote(str(base))}" if base else "")


# -- checks ------------------------------------------------------------------------------------
def _cache(d: Path, config: dict, generation: dict | None) -> list[Finding]:
    # generate reads generation_config.json when it exists; config.json decides only without it.
    # Without it, 5.x reads config.json's top level first (a true there wins over text_config); 4.x reads both.
    decisive = "generation_config.json" if generation is not None else "config.json"
    enabled = saved_cache_enabled(config, generation)
    out = []
    for where in cache_off_locations(config, generation):
        if where.startswith(decisive) and not enabled:
            sev, why = "error", "plain model.generate recomputes the whole sequence at every step (5-15x slower)"
        elif generation is None:
            sev, why = "warning", ("this transformers' generate reads the top-level true first, but transformers 4.x's "
                                   "generate (what GRPO trainers pin) recomputes the whole sequence at every step")
        else:
            sev, why = "warning", "generate reads generation_config.json, but other loaders and servers read this"
        out.append(Finding(sev, "cache-off", where, f"use_cache is false: {why}", f"{_fix_cmd(d)} (sets it to true)"))
    return out


def _eos(d, config, generation, base_dir, base_cfg) -> list[Finding]:
    eos, where = saved_eos(config, generation)
    stop, stop_id = chat_stop(d, config, base_dir)
    base_eos = saved_eos(base_cfg, maybe_json(base_dir / "generation_config.json") or None)[0] if base_dir else None
    fix = _fix_cmd(d, base_dir)
    text = saved_eos_not_ids(config, generation)  # e.g. "<|im_end|>" written as text: no id, left out
    said = f"EOS list {eos}" + (f" (and {', '.join(map(repr, text))}, which is no token id)" if text else "")
    if stop_id is not None and stop_id not in eos:
        wanted = f"the base's {base_eos}" if base_eos else f"{family_eos(d, config, eos, stop_id)}"
        return [Finding("error", "eos-missing-im-end", where,
                        f"{said} lacks {stop} (id {stop_id}): chat replies never stop and run to the token cap",
                        f"{fix} (sets it to {wanted})")]
    if base_eos and set(eos) != set(base_eos):
        return [Finding("warning", "eos-differs-from-base", where, f"EOS list {eos} differs from the base's {base_eos}",
                        f"{fix} (takes the base's list)")]
    full = family_eos(d, config, eos, stop_id) if stop_id is not None and not base_eos else eos
    missing, outside = [i for i in full if i not in eos], [i for i in eos if i not in full]  # outside the vocabulary
    if missing or outside:  # e.g. <|endoftext|> lost, <|im_end|> kept; or ids copied from another model
        said = [f"lacks {missing}, which the family's released generation config stops on: an answer ending with it "
                "runs on to the token cap"] * bool(missing) + [f"holds {outside}, outside the vocabulary"] * bool(outside)
        return [Finding("warning", "eos-short-of-family", where, f"EOS list {eos} {'; it '.join(said)}",
                        f"{fix} (sets it to {full})")]
    return []


def _generation_missing(d: Path, config: dict, generation: dict | None, base_dir: Path | None) -> list[Finding]:
    """No generation_config.json (merges lose it): generate runs without the base's settings (a lost chat stop: _eos)."""
    return [] if generation is not None else [Finding(
        "info", "generation-config-missing", "generation_config.json", f"no generation_config.json: plain generate "
        f"stops on config.json's EOS {saved_eos(config, None)[0]} and uses transformers' defaults, not the base's "
        "sampling settings (vlmfast uses its own settings and EOS list)", f"{_fix_cmd(d, base_dir or Path('BASE'))} "
        "(copies the base's)")]


def _files(d: Path, base_dir: Path | None) -> list[Finding]:
    out, fix = [], _fix_cmd(d, base_dir or Path("BASE"))
    if not has_processor_config(d):
        out.append(Finding("error", "processor-missing", "preprocessor_config.json",
                           "no image processor config (preprocessor_config.json / processor_config.json): the processor cannot load",
                           f"{fix} (copies it from the base model)"))
    missing = [f for f in ("tokenizer_config.json",) if not (d / f).is_file()]
    if not tokenizer_files_whole(d):  # vocab.json + merges.txt may not do: readers.tokenizer_files_whole
        missing.append("tokenizer.json" + ("" if (d / "vocab.json").is_file() else " (or vocab.json + merges.txt)"))
    if missing:
        out.append(Finding("error", "tokenizer-missing", missing[0], f"tokenizer files missing: {', '.join(missing)}",
                           f"{fix} (copies them from the base model)"))
    if not has_chat_template(d):
        out.append(Finding("warning", "chat-template-missing", "chat_template.jinja",
                           "no chat template: other tools cannot build prompts; vlmfast uses Qwen2-VL's released one or ChatML",
                           f"{fix} (copies it from the base model)"))
    return out


def _saved_by_v5(d: Path) -> list[Finding]:
    """Where transformers 4.x is installed: settings saved in transformers 5's form, which vlmfast reads
    through a rewritten temporary copy and other 4.x tools cannot load (fix writes the form both read),
    and weights 4.x cannot read at all."""
    from vlmfast.checkpoints.portable import unreadable_by_v4, v4_cannot_read

    here = installed_transformers()
    if here is None or here >= (5,):
        return []
    version = ".".join(map(str, here))
    weights = v4_cannot_read(d)
    if weights:
        return [Finding("error", "saved-by-transformers-5", "*.safetensors", f"transformers {version} cannot load it "
                        f"({weights})", "run it where transformers 5 is installed: pip install 'transformers>=5'")]
    lines = unreadable_by_v4(d)
    if not lines:
        return []
    return [Finding("warning", "saved-by-transformers-5", ", ".join(dict.fromkeys(line.split(":")[0] for line in lines)),
                    f"saved in transformers 5's form, which transformers {version} cannot load (vlmfast reads it through "
                    "a rewritten temporary copy; other tools stop)", f"{_fix_cmd(d)} (writes the form 4.x and 5.x both read)")]


def _processor_settings(d: Path) -> dict[str, tuple[str, object]]:
    """``processor_class`` and ``patch_size`` → (``file: key`` location, value), wherever this layout keeps
    them: preprocessor_config.json (4.x) or processor_config.json with a nested ``image_processor`` (5.x)."""
    found = {}
    for name in ("processor_config.json", "preprocessor_config.json"):
        data = maybe_json(d / name)
        nested = data.get("image_processor") if isinstance(data.get("image_processor"), dict) else {}
        candidates = (("processor_class", "processor_class", data.get("processor_class")),
                      ("patch_size", "patch_size", data.get("patch_size")),
                      ("patch_size", "image_processor.patch_size", nested.get("patch_size")))
        for key, where, value in candidates:
            if value is not None:
                found.setdefault(key, (f"{name}: {where}", value))
    return found


def _family(d: Path, config: dict) -> list[Finding]:
    family = family_of(config)
    if family is None:
        return [Finding("info", "untested-family", "config.json: model_type", untested_note(config.get("model_type")), "")]
    out, settings = [], _processor_settings(d)
    installed = installed_transformers()
    if installed is not None and installed < version_tuple(family.since):
        out.append(Finding("error", "unknown-class", "config.json: model_type",
                           f"{family.name} ({family.model_class}) is not in the installed transformers "
                           f"{'.'.join(map(str, installed))}: it needs transformers >= {family.since}",
                           "pip install -U transformers"))
    where, named = settings.get("processor_class", ("", None))
    owner = next((f for f in FAMILIES if f.processor_class == named), None)
    if owner is not None and named != family.processor_class:
        out.append(Finding("warning", "processor-family-mismatch", where,
                           f"{named} is {owner.name}'s processor, but the model is {family.name} "
                           f"({family.processor_class}): prompts may get the wrong vision tokens or positions",
                           f"copy the processor files from a {family.name} base model"))
    vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else {}
    (where, patch), model_patch = settings.get("patch_size", ("", None)), vision.get("patch_size", family.patch_size)
    if isinstance(patch, int) and patch != model_patch:
        out.append(Finding("error", "processor-family-mismatch", where,
                           f"the image processor cuts {patch}-pixel patches but {family.name}'s vision tower takes "
                           f"{model_patch}: image token counts will not match the features",
                           f"copy the processor files from a {family.name} base model"))
    return out




def _class_keys(d: Path):
    """(file, key, class name) for every processor/tokenizer class a file names, unless it ships
    remote code for it (auto_map)."""
    for name in ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
                 "tokenizer_config.json"):
        data = maybe_json(d / name)
        if "auto_map" in data:
            continue
        for key in ("image_processor_type", "video_processor_type", "processor_class", "tokenizer_class"):
            if isinstance(data.get(key), str):
                yield name, key, data[key]
        for sub, key in (("image_processor", "image_processor_type"), ("video_processor", "video_processor_type")):
            if isinstance(data.get(sub), dict) and isinstance(data[sub].get(key), str):
                yield name, f"{sub}.{key}", data[sub][key]


def known_class(name: str) -> bool:
    """Whether the installed transformers exports a class of that name (deprecated aliases count).
    Names every supported version exports answer without importing transformers."""
    if name in ALWAYS_KNOWN:
        return True
    import transformers
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # 5.x logs a deprecation warning for old aliases: not ours to show
    try:
        return getattr(transformers, name, None) is not None
    except Exception:  # a lazy import can fail on a missing optional dependency
        return False
    finally:
        hf_logging.set_verbosity(level)


def _classes(d: Path) -> list[Finding]:
    out = []
    for file, key, name in _class_keys(d):
        if known_class(name):
            continue
        import transformers  # known_class imported it already

        saved = maybe_json(d / "config.json").get("transformers_version", "unknown")
        instead = f"set {key} to {RENAMED[name]!r}" if name in RENAMED else "copy the file from the base model"
        out.append(Finding("error", "unknown-class", f"{file}: {key}",
                           f"{name!r} is not a class of the installed transformers {transformers.__version__} "
                           f"(the checkpoint was saved with {saved})",
                           f"{instead}, or install the transformers version it was saved with"))
    return out


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def _weights(target: Located, base_dir: Path | None, float32_min_bytes: int) -> list[Finding]:
    d, out = target.path, []
    if target.kind == "fsdp":
        out.append(Finding("error", "fsdp-unmerged", str(d.parent),
                           f"{len(target.shards)} FSDP shards ({target.shards[0].name}, ...) are not merged: {d} has no weights",
                           fsdp_merge_hint(target)))
    elif target.kind == "incomplete" and (sharded := shards_said(d)) is not None:
        out.append(Finding("error", "weights-missing", str(d), sharded[0], sharded[1]))
    elif target.kind == "incomplete":
        out.append(Finding("error", "weights-missing", str(d), "config.json but no weights (*.safetensors / *.bin)",
                           "the save is incomplete: save again, or point at a checkpoint-N that holds weights"))
    elif (incomplete := incomplete_said(d)) is not None:
        out.append(Finding("error", "weights-incomplete", str(d), incomplete,
                           "the save was cut short or is still being written: save again, "
                           "or point at the run directory (its highest complete checkpoint is used)"))
    pickles = [p.name for p in sorted(d.glob("*.bin")) if p.name not in NOT_WEIGHTS]
    if pickles and not any(d.glob("*.safetensors")):
        out.append(Finding("warning", "pickle-weights", pickles[0],
                           f"weights are pickle files ({', '.join(pickles[:3])}): loading them runs torch.load, which can execute code",
                           "convert to safetensors: load once and save_pretrained(DIR, safe_serialization=True); "
                           "or, if you trust their source, pass --allow-pickle"))
    try:
        index = tensor_index(d)
        base_index = tensor_index(base_dir) if base_dir else {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return out + [Finding("error", "weights-unreadable", str(d), f"a safetensors header cannot be read ({exc})",
                              "the file is truncated or corrupt: copy or save it again")]
    total = sum(n for _, _, n in index.values())
    f32 = sum(n for dtype, _, n in index.values() if dtype == "F32")
    base_half = bool(base_index) and all(dtype != "F32" for dtype, _, _ in base_index.values())
    if f32 > total / 2 and (f32 >= float32_min_bytes or base_half):
        why = "the base is stored in 16-bit" if base_half else "twice the disk and load time of bfloat16"
        out.append(Finding("warning", "float32-weights", "*.safetensors",
                           f"weights stored in float32: {_mib(total)} on disk, {_mib(total - f32 // 2)} in bfloat16 ({why})",
                           "load with --dtype bfloat16 (default on CUDA), or save a bfloat16 copy: "
                           "model.to(torch.bfloat16).save_pretrained(DIR)"))
    return out


def _remote_code(d: Path) -> list[Finding]:
    out = []
    for name in ("config.json", "tokenizer_config.json", *PROCESSOR_CONFIGS):
        auto_map = maybe_json(d / name).get("auto_map")
        if auto_map:
            py = sorted(p.name for p in d.glob("*.py"))
            out.append(Finding("warning", "remote-code", f"{name}: auto_map",
                               f"auto_map names the checkpoint's own Python code ({', '.join(py) or 'files not here'}): "
                               "it runs only with --trust-remote-code",
                               "read the .py files before passing --trust-remote-code; the Qwen-VL families need no "
                               "remote code: delete auto_map to use transformers' own classes"))
    return out


def _adapter(d: Path, base) -> list[Finding]:
    cfg, named = adapter_config(d), adapter_base_or_none(d)
    here = named is not None and (Path(named).expanduser().exists() or HUB_ID.match(named) is not None)
    use = str(base) if base is not None else named if here else None  # a base that is not here: BASE, not its path
    out = [Finding("warning", "lora-adapter", str(d),
                   f"a LoRA adapter (r={cfg.get('r')}, {cfg.get('peft_type', 'LORA')}), not a full model; base: {named or 'not named'}",
                   f"run it on its base: vlmfast infer --ckpt {shlex.quote(str(d))} --base {shlex.quote(use or 'BASE')}; "
                   f"or merge it: vlmfast fix {shlex.quote(str(d))} --merge-lora OUT")]
    if base is None and not here:
        out.append(Finding("error", "lora-base-missing", f"{d.name}/adapter_config.json: base_model_name_or_path",
                           f"the adapter's base {named!r} is not here", "pass the base model: --base BASE"))
    return out


def _trainer_leftovers(d: Path) -> list[Finding]:
    out = []
    state = maybe_json(d / "trainer_state.json")
    if state:
        last = next((e for e in reversed(state.get("log_history") or []) if isinstance(e, dict)), {})
        logged = ", ".join(f"{k} {last[k]}" for k in ("reward", "loss") if k in last)
        best = state.get("best_model_checkpoint")
        out.append(Finding("info", "trainer-state", "trainer_state.json",
                           f"saved at global_step {state.get('global_step')}"
                           + (f" of {state['max_steps']}" if state.get("max_steps") is not None else "")
                           + (f"; last logged: {logged}" if logged else "") + (f"; best checkpoint: {best}" if best else ""),
                           ""))
    args = maybe_json(d / "args.json")
    if args:
        what = ", ".join(f"{k} {args[k]!r}" for k in ("train_type", "rlhf_type", "model") if k in args)
        out.append(Finding("info", "swift-args", "args.json", f"ms-swift run: {what}", ""))
    return out


def _parity(d: Path, evaluation: dict | None) -> list[Finding]:
    from vlmfast.checkpoints.training import compare, differences, training_settings

    training = training_settings(d) if evaluation is not None else None
    listed = differences(compare(training, evaluation)) if training is not None else []
    return [Finding("warning", "train-eval-differs", ", ".join(os.path.relpath(f, d) for f in training.files),
                    "vlmfast infer's settings differ from training in: " + "; ".join(listed),
                    f"vlmfast infer --ckpt {shlex.quote(str(d))} --match-training (or give each setting)")] if listed else []
