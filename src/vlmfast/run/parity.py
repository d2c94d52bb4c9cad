"""Train ↔ eval parity: the settings an evaluation will use (defaults included) beside the ones the run
was trained with (:mod:`vlmfast.checkpoints.training`), and ``--match-training``, which adopts the training
values for every setting not given on the command line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from vlmfast.checkpoints.training import TrainingSettings, compare, format_template, nothing_found, training_settings

# setting → the option (command-line name) that sets it
OPTION_OF = {"format_prompt": "template", "system": "system", "min_pixels": "min_pixels", "max_pixels": "max_pixels",
             "resize_rule": "resize_rule",
             "max_new_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p", "n": "n",
             "repetition_penalty": "repetition_penalty",
             "reward": "reward", "reward_weights": "reward_weights", "reward_kwargs": "reward_kwargs"}
GENERATION = ("max_new_tokens", "temperature", "top_p", "n", "repetition_penalty")


def _pixel_defaults(ckpt) -> tuple[tuple[int, str], tuple[int, str]]:
    """The processor's own (min, max) pixels as the engine will use them (max capped), read from the
    checkpoint's processor config without loading it."""
    from vlmfast.checkpoints.readers import maybe_json
    from vlmfast.engines.prepare import DEFAULT_MAX_PIXELS_CAP, pixel_limits

    d = Path(ckpt).expanduser()
    for name in ("preprocessor_config.json", "processor_config.json"):
        data = maybe_json(d / name)
        data = data.get("image_processor", data) if isinstance(data.get("image_processor"), dict) else data
        if not data:
            continue
        lo, hi = pixel_limits(data.get("size") if isinstance(data.get("size"), dict) else {}, data.get("min_pixels"),
                              data.get("max_pixels"))
        capped = f" capped at {DEFAULT_MAX_PIXELS_CAP}" if hi > DEFAULT_MAX_PIXELS_CAP else ""
        return (lo, f"the processor's ({name})"), (min(hi, DEFAULT_MAX_PIXELS_CAP), f"the processor's ({name}){capped}")
    lo, hi = pixel_limits({})
    return (lo, "the processor's (default)"), (min(hi, DEFAULT_MAX_PIXELS_CAP), "the processor's (capped default)")


def evaluation_settings(options, where: Path | None = None) -> dict[str, tuple[object, str]]:
    """What a run with ``options`` (:class:`~vlmfast.run.options.InferOptions`) will use: setting → (value,
    where it comes from: the flag, or the default). ``where``: the checkpoint's directory, when located."""

    from vlmfast.evaluation.rewards import parse_reward_kwargs, parse_reward_weights
    from vlmfast.declared import default_of

    g = options.generation

    def flag(name, value, default):
        return value, f"--{name.replace('_', '-')}" + (" (default)" if value == default else "")

    def generation(name):  # the default from the field that declares it
        return flag(name, getattr(g, name), default_of(type(g), name))

    lo, hi = _pixel_defaults(where or _checkpoint_dir(options.ckpt))
    kwargs = parse_reward_kwargs(options.reward_kwargs) if options.reward_kwargs else None  # UsageError when not a JSON object
    reward = ([options.reward] if isinstance(options.reward, str) else list(options.reward)) if options.reward else None
    return {
        "format_prompt": _format_prompt(options),
        "system": flag("system", options.system, default_of(type(options), "system")),
        "min_pixels": (options.min_pixels, "--min-pixels") if options.min_pixels else lo,
        "max_pixels": (options.max_pixels, "--max-pixels") if options.max_pixels else hi,
        "resize_rule": flag("resize_rule", options.resize_rule, default_of(type(options), "resize_rule")),
        **{name: generation(name) for name in GENERATION},
        "repetition_penalty": _penalty(g.repetition_penalty, where or _checkpoint_dir(options.ckpt)),
        "reward": (reward, "--reward") if reward else (None, f"vlmfast's scorer (--scorer {options.scorer})"),
        "reward_weights": (list(parse_reward_weights(options.reward_weights, len(options.reward_weights.split(",")))), "--reward-weights")
        if options.reward_weights else (None, "--reward-weights (default: equal)"),
        "reward_kwargs": flag("reward_kwargs", kwargs, default_of(type(options), "reward_kwargs")),
        "eos": (None, "the checkpoint's EOS ids + the chat stop (<|im_end|>)"),
    }


def _penalty(given: float | None, ckpt) -> tuple[float | None, str]:
    """The repetition penalty a run applies: ``--repetition-penalty``, else the checkpoint's generation config's
    (an adapter's base model's; None where that is a hub id)."""
    from vlmfast.checkpoints.readers import maybe_json

    if given is not None:
        return given, "--repetition-penalty"
    d = Path(ckpt).expanduser()
    base = maybe_json(d / "adapter_config.json").get("base_model_name_or_path")  # an adapter runs on its base's
    if isinstance(base, str) and base and not (d / "generation_config.json").is_file():
        if not Path(base).expanduser().is_dir():
            return None, f"the base model's generation config ({base}: not read here)"
        d = Path(base).expanduser()
    theirs = maybe_json(d / "generation_config.json").get("repetition_penalty")
    if isinstance(theirs, (int, float)) and not isinstance(theirs, bool):
        return float(theirs), "the checkpoint's generation config"
    return 1.0, "--repetition-penalty (default: none)"


def _format_prompt(options) -> tuple[str, str]:
    """The evaluation's format prompt: its ``--format-prompt`` Jinja file's text, else the ``--template``."""
    from vlmfast.inputs.requests import TEMPLATES

    if options.format_prompt and Path(options.format_prompt).is_file():
        return Path(options.format_prompt).read_text(encoding="utf-8").strip(), f"--format-prompt {options.format_prompt}"
    return TEMPLATES[options.template], f"--template {options.template}"


def _checkpoint_dir(ckpt) -> Path:
    from vlmfast.checkpoints.locate import Located, locate

    if isinstance(ckpt, Located):  # located once by the caller
        return ckpt.path
    try:
        return locate(ckpt).path
    except Exception:  # noqa: BLE001 - a hub id or a missing path: nothing beside it to read
        return Path(str(ckpt))


def parity(training: TrainingSettings | None, options, where: Path | None = None) -> list[dict]:
    """Rows ``{setting, training, evaluation, same, source}`` for every setting the training recorded."""
    return compare(training, evaluation_settings(options, where)) if training is not None else []


def explicit_of(options) -> frozenset[str]:
    """The options given explicitly: ``options.explicit`` when the command line said, else those whose
    value differs from its default (a Python caller's)."""
    if options.explicit is not None:
        return frozenset(options.explicit)
    defaults = type(options)(ckpt=options.ckpt)
    given = set()
    for setting, name in OPTION_OF.items():
        where = (options.generation, defaults.generation) if setting in GENERATION else (options, defaults)
        if getattr(where[0], name) != getattr(where[1], name):
            given.add(name)
    return frozenset(given)


def match_training(options, training: TrainingSettings | None) -> tuple[object, list[str], list[str]]:
    """``options`` with the training's values for every setting not given explicitly; (options, what was
    adopted, what could not be), one line each with its source."""
    if training is None:
        return options, [], []
    from vlmfast.inputs.requests import TEMPLATES

    given, change, gen, adopted, kept = explicit_of(options), {}, {}, [], []
    values = training.values
    for name in (n for n in OPTION_OF if n in values):  # reward before its weights and kwargs
        setting, option = values[name], OPTION_OF[name]
        if option in given or (name == "format_prompt" and "format_prompt" in given):
            continue
        value, said = setting.value, f"{setting.source}"
        if name == "format_prompt":
            template = next((t for t, text in TEMPLATES.items() if format_template(text) == format_template(str(value))), None)
            jinja = Path(said.rsplit(" (", 1)[0])  # EasyR1 names its Jinja file: rendered as the trainer renders it
            if template is None and jinja.is_file() and jinja.suffix in (".jinja", ".j2", ".txt", ""):
                change["format_prompt"] = str(jinja)
                adopted.append(f"--format-prompt {jinja} ({said.rsplit(' (', 1)[-1]}")
                continue
            if template is None:
                kept.append(f"format prompt ({said}): neither --template plain nor r1, and no Jinja file here to "
                            "render it: give it with --format-prompt FILE")
                continue
            value = template
        elif name == "reward":
            refs = value if isinstance(value, list) else [value]
            builtin = [str(r) for r in refs if ".py" not in str(r)]
            missing = [str(r) for r in refs if ".py" in str(r) and not Path(str(r).rpartition(":")[0] or str(r)).is_file()]
            if builtin or missing:
                why = (f"{', '.join(builtin)}: the trainer's built-in reward, not a FILE.py:FUNCTION" if builtin
                       else f"{', '.join(missing)}: not found on this machine")
                kept.append(f"reward ({said}): {why}; pass --reward FILE.py:FUNCTION with a local copy")
                continue
            value = [str(r) for r in refs]
        elif name in ("reward_weights", "reward_kwargs"):
            if not (options.reward or "reward" in change):
                continue  # weights and kwargs of a reward that is not used
            value = ",".join(f"{float(w):g}" for w in value) if name == "reward_weights" else json.dumps(value)
        (gen if name in GENERATION else change)[option] = value
        shown = " ".join(map(str, value)) if isinstance(value, list) else value
        adopted.append(f"--{option.replace('_', '-')} {shown} ({said})")
    if gen:
        change["generation"] = dataclasses.replace(options.generation, **gen)
    return (dataclasses.replace(options, **change) if change else options), adopted, kept


def parity_report(ckpt, options, training: TrainingSettings | None = None, *, adopted=(), kept=()) -> dict:
    """The ``parity`` part of a report: the trainer, the files read, the rows, what ``--match-training``
    adopted (and could not), and notes; a single note when nothing readable is beside ``ckpt``."""
    if training is None:
        return {"trainer": None, "files": [], "rows": [], "adopted": [], "not_adopted": [], "notes": [nothing_found(ckpt)]}
    rows = parity(training, options, Path(ckpt))
    for row in rows:  # say where an adopted value came from
        flag = f"--{OPTION_OF.get(row['name'], '').replace('_', '-')} "
        if any(line.startswith(flag) for line in adopted):
            row["evaluation_source"] = f"{flag.strip()} adopted by --match-training"
    notes = list(training.notes)
    if not training.values:
        notes.append(f"{', '.join(training.files)}: {training.trainer} records no sampling or prompt settings")
    differs = [r["setting"] for r in rows if r["same"] is False]
    if differs and not adopted:
        notes.append(f"evaluation differs from training in: {', '.join(differs)} (--match-training adopts the training's)")
    return {"trainer": training.trainer, "files": training.files, "rows": rows, "adopted": list(adopted),
            "not_adopted": list(kept), "notes": notes}


def prepare(options, ckpt=None) -> tuple[object, dict]:
    """Read the training settings beside ``ckpt`` (default: ``options.ckpt``), adopt them when
    ``options.match_training``, and return (the options to run with, the ``parity`` report part)."""
    where = _checkpoint_dir(ckpt if ckpt is not None else options.ckpt)
    training = training_settings(where)
    adopted, kept = [], []
    if options.match_training:
        options, adopted, kept = match_training(options, training)
    return options, parity_report(where, options, training, adopted=adopted, kept=kept)
