"""What a run was trained with, read from the files its trainer left beside the checkpoints, and how an
evaluation's settings compare with it.

Read without unpickling anything: ms-swift's ``args.json`` (in the run's ``vX-…`` dir and in each
checkpoint), EasyR1's ``experiment_config.json`` (its ``file`` logger writes it into
``save_checkpoint_path``, beside ``global_step_N/``; the format prompt is the Jinja file ``data.format_prompt``
names), a ``config.yaml`` of EasyR1 or verl kept beside the run, verl's Hydra ``.hydra/config.yaml``, and HF
Trainer's ``trainer_state.json`` (which records no sampling settings). ``training_args.bin`` is a pickle: it
is named, never read. YAML needs PyYAML (a dependency of transformers); JSON needs nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# directory names a checkpoint sits in below its run's root (the search climbs through them)
RUN_PARTS = re.compile(r"^(huggingface|actor|checkpoint-\d+(-merged)?|global_step_\d+|v\d+-\d{8}-\d{6})$")
FILES = ("args.json", "experiment_config.json", "config.yaml", ".hydra/config.yaml", "trainer_state.json")
LOOKED_FOR = ("args.json (ms-swift), experiment_config.json or config.yaml (EasyR1), .hydra/config.yaml (verl), "
              "trainer_state.json (HF Trainer, TRL, VLM-R1)")
# the settings compared, in table order, with how they are shown
SETTINGS = {"format_prompt": "format prompt", "system": "system prompt", "min_pixels": "min pixels",
            "max_pixels": "max pixels", "resize_rule": "resize rule", "max_new_tokens": "max new tokens", "temperature": "temperature",
            "top_p": "top p", "n": "answers per prompt (n)", "repetition_penalty": "repetition penalty",
            "reward": "reward function(s)",
            "reward_weights": "reward weights", "reward_kwargs": "reward kwargs", "eos": "stop words / EOS"}
JINJA_CONTENT = re.compile(r"\{\{-?\s*content\s*(\|\s*trim\s*)?-?\}\}")


@dataclass(frozen=True)
class Setting:
    """One training value and where it was read (``file: key``)."""

    value: object
    source: str


@dataclass
class TrainingSettings:
    """What the trainer recorded: ``trainer`` (ms-swift | easyr1 | verl | hf-trainer), the files read,
    ``values`` (a name of :data:`SETTINGS` → :class:`Setting`) and what could not be read (``notes``)."""

    trainer: str
    files: list[str] = field(default_factory=list)
    values: dict[str, Setting] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def search_dirs(ckpt) -> list[Path]:
    """The checkpoint's dir and its parents up to the run's root: each parent is searched while the dir
    below it is a trainer's checkpoint part (``checkpoint-N``, ``global_step_N``, ``actor``, …)."""
    here = Path(ckpt).expanduser()
    if here.is_file():
        here = here.parent
    if not here.is_dir():
        return []
    dirs = [here]
    while RUN_PARTS.match(dirs[-1].name) and dirs[-1].parent != dirs[-1]:
        dirs.append(dirs[-1].parent)
    return dirs


def training_settings(ckpt) -> TrainingSettings | None:
    """The training settings recorded beside ``ckpt`` (a checkpoint or run dir), nearest file first (a
    checkpoint's own ``args.json`` wins over its run's); None when no readable training file is there."""
    found: TrainingSettings | None = None
    notes = []
    for d in search_dirs(ckpt):
        if (d / "training_args.bin").is_file():
            notes.append(f"{d / 'training_args.bin'}: a pickle, not read (loading it could run code)")
        for name in FILES:
            path = d / name
            if not path.is_file():
                continue
            data, problem = _read(path)
            if problem:
                notes.append(problem)
                continue
            read = _settings_of(path, data)
            if read is None:
                continue
            trainer, values, said = read
            notes += said
            if found is None:
                found = TrainingSettings(trainer)
            found.files.append(str(path))
            for key, setting in values.items():
                found.values.setdefault(key, setting)
    if found is not None:
        found.notes = notes
    return found


def _read(path: Path) -> tuple[dict | None, str | None]:
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            try:
                import yaml
            except ImportError:
                return None, f"{path}: not read (PyYAML is not installed: pip install pyyaml)"
            data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - a broken file is reported, never fatal
        return None, f"{path}: not readable ({type(exc).__name__}: {exc})"
    return (data, None) if isinstance(data, dict) else (None, f"{path}: not a mapping of settings")


def _dig(data: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _settings_of(path: Path, data: dict):
    """(trainer, values, notes) of one file, or None when it is no trainer's configuration."""
    if path.name == "args.json":
        values = _swift(path, data)
        said = [] if "max_pixels" in values else [
            f"{path}: no max_pixels; ms-swift then takes the pixel limits from the MAX_PIXELS / MIN_PIXELS environment "
            "variables, which it does not record: compare them by hand"]
        return "ms-swift", values, said
    if path.name == "trainer_state.json":
        return ("hf-trainer", {}, []) if "global_step" in data else None
    if isinstance(data.get("data"), dict) and isinstance(data.get("worker"), dict):
        return _easyr1(path, data)
    if isinstance(data.get("actor_rollout_ref"), dict):
        return "verl", _verl(path, data), []
    return None


def _take(values: dict, name: str, path: Path, data: dict, keys: tuple[str, ...], kind=(int, float)) -> None:
    """The first of ``keys`` present with a value of ``kind`` becomes setting ``name``."""
    for key in keys:
        value = _dig(data, key)
        if isinstance(value, kind) and not isinstance(value, bool) and value not in ("", [], {}):
            values[name] = Setting(value, f"{path.name}: {key}")
            return


def _swift(path: Path, a: dict) -> dict:
    v: dict = {}
    _take(v, "system", path, a, ("system",), str)
    _take(v, "min_pixels", path, a, ("min_pixels",), int)
    _take(v, "max_pixels", path, a, ("max_pixels",), int)
    grpo = a.get("rlhf_type") == "grpo" or "num_generations" in a
    _take(v, "max_new_tokens", path, a, ("max_completion_length", "max_new_tokens") if grpo else ("max_new_tokens",), int)
    _take(v, "temperature", path, a, ("temperature",))
    _take(v, "top_p", path, a, ("top_p",))
    _take(v, "repetition_penalty", path, a, ("repetition_penalty",))  # None there: the generation config's, as ours
    if grpo:
        _take(v, "n", path, a, ("num_generations",), int)
    _take(v, "reward", path, a, ("reward_funcs",), list)
    _take(v, "reward_weights", path, a, ("reward_weights",), list)
    _take(v, "eos", path, a, ("stop_words",), list)
    return v


def _easyr1(path: Path, c: dict):
    v: dict = {}
    notes = []
    prompt = _dig(c, "data.format_prompt")
    if isinstance(prompt, str) and prompt:
        jinja = Path(prompt) if Path(prompt).is_absolute() else path.parent / prompt
        try:
            v["format_prompt"] = Setting(jinja.read_text(encoding="utf-8").strip(), f"{jinja} (data.format_prompt)")
        except OSError:
            notes.append(f"{path.name}: data.format_prompt names {prompt}, which is not here: the format prompt "
                         "cannot be compared")
    _take(v, "min_pixels", path, c, ("data.min_pixels",), int)
    _take(v, "max_pixels", path, c, ("data.max_pixels",), int)
    if "min_pixels" in v or "max_pixels" in v:  # its process_image scales images into them, then the processor resizes
        v["resize_rule"] = Setting("easyr1", f"{path.name}: data.min_pixels/max_pixels (EasyR1's process_image)")
    _take(v, "max_new_tokens", path, c, ("data.max_response_length",), int)
    for name in ("temperature", "top_p"):  # validation's sampling: the rollout's, with val_override_config on top
        _take(v, name, path, c, (f"worker.rollout.val_override_config.{name}", f"worker.rollout.{name}"))
    # but not the rollout's n: _validate repeats each prompt val_override_config.get("n", 1) times
    _take(v, "n", path, c, ("worker.rollout.val_override_config.n",), int)
    if "n" not in v and isinstance(_dig(c, "worker.rollout"), dict):
        v["n"] = Setting(1, f"{path.name}: worker.rollout.val_override_config (no n: one answer per prompt)")
    function, named = _dig(c, "worker.reward.reward_function"), _dig(c, "worker.reward.reward_function_name")
    if isinstance(function, str) and function:
        ref = f"{function}:{named}" if isinstance(named, str) and ":" not in Path(function).name else function
        v["reward"] = Setting([ref], f"{path.name}: worker.reward.reward_function")
    else:
        _take(v, "reward", path, c, ("worker.reward.compute_score",), str)  # EasyR1 <= 0.3: a built-in's name
    _take(v, "reward_kwargs", path, c, ("worker.reward.reward_function_kwargs",), dict)
    return "easyr1", v, notes


def _verl(path: Path, c: dict) -> dict:
    v: dict = {}
    _take(v, "max_new_tokens", path, c, ("data.max_response_length",), int)
    rollout = "actor_rollout_ref.rollout"
    if _dig(c, f"{rollout}.val_kwargs.do_sample") is False:  # validation decodes greedily
        v["temperature"] = Setting(0.0, f"{path.name}: {rollout}.val_kwargs.do_sample")
    for name in ("temperature", "top_p"):
        if name not in v:
            _take(v, name, path, c, (f"{rollout}.val_kwargs.{name}", f"{rollout}.{name}"))
    _take(v, "n", path, c, (f"{rollout}.val_kwargs.n",), int)  # validation's own n (1 by default), never the rollout's
    function, named = _dig(c, "custom_reward_function.path"), _dig(c, "custom_reward_function.name")
    if isinstance(function, str) and function:
        v["reward"] = Setting([f"{function}:{named or 'compute_score'}"], f"{path.name}: custom_reward_function.path")
    _take(v, "reward_kwargs", path, c, ("custom_reward_function.reward_kwargs",), dict)
    return v


# -- comparing -------------------------------------------------------------------------------------
def format_template(text: str) -> str:
    """A format prompt as a ``{prompt}`` template: EasyR1's Jinja ``{{ content | trim }}`` becomes ``{prompt}``,
    runs of whitespace one space."""
    return " ".join(JINJA_CONTENT.sub("{prompt}", text).split())


def _reward_key(ref) -> str:
    """``FILE.py:FUNCTION`` by file name and function (the trainer's absolute path is another machine's)."""
    file, _, function = str(ref).rpartition(":") if ".py:" in str(ref) else (str(ref), "", "")
    return f"{Path(file).name}:{function}" if function else Path(str(ref)).name


def same(name: str, training, evaluation) -> bool | None:
    """Whether a training value and an evaluation value mean the same; None where they cannot be compared."""
    if name == "format_prompt":
        return format_template(str(training)) == format_template(str(evaluation))
    if name == "eos":
        return None  # words (training) against token ids (evaluation)
    if name == "reward":
        theirs = [_reward_key(r) for r in (training if isinstance(training, list) else [training])]
        ours = [_reward_key(r) for r in evaluation] if isinstance(evaluation, list) else None
        return theirs == ours
    if name == "reward_weights" and isinstance(evaluation, list):
        return [float(x) for x in training] == [float(x) for x in evaluation]
    if isinstance(training, (int, float)) and isinstance(evaluation, (int, float)):
        return float(training) == float(evaluation)
    return training == evaluation


def compare(training: TrainingSettings, evaluation: dict[str, tuple[object, str]]) -> list[dict]:
    """One row per setting the training recorded: ``{setting, training, evaluation, same, source,
    evaluation_source}``. ``evaluation``: a name of :data:`SETTINGS` → (the value the evaluation uses, where it
    comes from)."""
    rows = []
    for name, label in SETTINGS.items():
        if name not in training.values:
            continue
        theirs = training.values[name]
        ours, where = evaluation.get(name, (None, "not set"))
        rows.append({"setting": label, "name": name, "training": theirs.value, "evaluation": ours,
                     "same": same(name, theirs.value, ours), "source": theirs.source, "evaluation_source": where})
    return rows


def nothing_found(ckpt) -> str:
    """The note when no training configuration is beside ``ckpt``."""
    return f"no training configuration found beside the checkpoint (looked for {LOOKED_FOR} in " \
           f"{', '.join(str(d) for d in search_dirs(ckpt)) or ckpt})"


def differences(rows: list[dict]) -> list[str]:
    """``setting (training X, evaluation Y)`` for each row of :func:`compare` that differs."""
    def short(value) -> str:
        text = " ".join((value if isinstance(value, str) else "none" if value is None else json.dumps(value)).split())
        return text if len(text) <= 40 else text[:39] + "…"

    return [f"{r['setting']} (training {short(r['training'])}, evaluation {short(r['evaluation'])})"
            for r in rows if r["same"] is False]
