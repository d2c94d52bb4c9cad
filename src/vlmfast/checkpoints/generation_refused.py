"""generation_config.json values transformers refuses: doctor's findings, fix's repairs and infer's check.

Trainers and merge scripts write generation_config.json by hand or from a training config (numbers as strings,
``num_beams: 0``, a cache or a generate() argument transformers does not know). What transformers 4.57.6 and 5.24
do with each, read in ``transformers/generation/configuration_utils.py`` (``GenerationConfig.__init__``,
``validate``), ``generation/utils.py`` (``_prepare_generation_config``, ``_get_logits_processor``, ``generate``)
and ``generation/logits_process.py``, and run on both lines:

- ``load``: ``GenerationConfig.__init__`` runs ``validate``, which raises (ValueError, or TypeError for a string
  compared with a number). ``PreTrainedModel.from_pretrained`` catches only OSError (no such file, not JSON)
  around ``GenerationConfig.from_pretrained``, so the model does not load at all.
- ``generate``: the config and the model load; plain ``model.generate`` raises before the first token (a logits
  processor's own check, a ``num_beams`` it cannot divide or repeat by, a token id it cannot make a tensor of).
  The sampling settings count only when ``do_sample`` is true: generate builds their warpers only then.
- ``misread``: generate runs, with another meaning (``do_sample: "false"`` is a true value: it samples).
- ``stop_strings`` load and then make plain generate raise unless it is given ``tokenizer=`` (a warning: a
  caller can pass one).

Found harmless on both lines (no rule): unknown keys (set as attributes, never read), ``num_beams: 1.0``,
``top_k: 0``, ``top_p`` of 0 or above 1 (above 1 builds no warper), a negative ``pad_token_id`` (a logged
warning), beam settings without beams (a logged warning). A file that is not a JSON object is refused by
vlmfast's readers before these rules (transformers' model load skips a file that is not JSON, with no warning).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from vlmfast.checkpoints.findings import Finding
from vlmfast.errors import CheckpointError

DROP, LEFT = "drop", "left"  # a rule's repair: remove the key; none obvious (the user edits it)
# GenerationConfig.validate: the cache implementations each line knows (ALL_CACHE_IMPLEMENTATIONS; 5.x adds "paged")
CACHE_IMPLEMENTATIONS = {
    4: ("static", "offloaded_static", "sliding_window", "hybrid", "hybrid_chunked", "offloaded_hybrid",
        "offloaded_hybrid_chunked", "dynamic", "dynamic_full", "offloaded", "quantized"),
    5: ("static", "offloaded_static", "sliding_window", "hybrid", "hybrid_chunked", "offloaded_hybrid",
        "offloaded_hybrid_chunked", "dynamic", "offloaded", "quantized", "paged"),
}
# GenerationConfig.validate: generate() arguments it refuses to find in a config ("use_model_defaults": 4.57 only)
GENERATE_ARGUMENTS = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "synced_gpus",
                      "assistant_model", "streamer", "negative_prompt_ids", "negative_prompt_attention_mask")
GENERATE_ARGUMENTS_4 = GENERATE_ARGUMENTS + ("use_model_defaults",)
# generation settings plain generate turns into logits processors (always; the SAMPLED ones when sampling): a
# number written as a string raises there (vlmfast's own decoder does not apply them: engines/generation_config.py)
PROCESSOR_NUMBERS = ("no_repeat_ngram_size", "min_length", "encoder_repetition_penalty", "epsilon_cutoff", "eta_cutoff")
SAMPLED_NUMBERS = ("epsilon_cutoff", "eta_cutoff")
WATERMARK_KEYS = ("greenlist_ratio", "bias", "hashing_key", "seeding_scheme", "context_width")  # WatermarkingConfig
SEVERITY = {"load": "error", "generate": "error", "misread": "warning", "tokenizer": "warning"}
CHANGED = {"load": "transformers refuses it", "generate": "plain generate refuses it",
           "misread": "plain generate misreads it", "tokenizer": "plain generate needs tokenizer="}
SAID = {"load": "transformers refuses to load the config, and so the model (from_pretrained raises)",
        "generate": "the model loads, and plain model.generate raises before the first token",
        "misread": "plain model.generate runs, with another meaning",
        "tokenizer": "plain model.generate raises unless it is called with tokenizer="}


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _parsed(v):
    """A number written as a string, as a number (an int when whole); None when it is not one."""
    if not isinstance(v, str):
        return v if _num(v) else None
    try:
        x = float(v.strip())
    except ValueError:
        return None
    return int(x) if x.is_integer() and "." not in v and "e" not in v.lower() else x


def _float_over_zero(v, g, c):  # logits_process.py: isinstance(…, float) and > 0 (an int 2 is refused)
    x = _parsed(v)
    return float(x) if x is not None and x > 0 else LEFT


def _whole(lowest: int, none_below=LEFT):
    def repair(v, g, c):
        x = _parsed(v)
        if x is None or (isinstance(x, float) and not x.is_integer()):
            return LEFT
        return int(x) if x >= lowest else none_below
    return repair


TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "none", "null")


def _bool(v, g, c):
    said = str(v).strip().lower()
    return True if said in TRUE_WORDS else False if said in FALSE_WORDS else LEFT


def _config_id(key):  # the same id in config.json (top level, else text_config), when it is an integer there
    def repair(v, g, c):
        for where in (c, c.get("text_config") if isinstance(c.get("text_config"), dict) else {}):
            if _int(where.get(key)):
                return where[key]
        return LEFT
    return repair


def _watermark_wrong(v) -> bool:
    if not isinstance(v, dict) or set(v) - set(WATERMARK_KEYS):
        return True
    ratio, width = v.get("greenlist_ratio", 0.25), v.get("context_width", 1)
    return not (_num(ratio) and 0 <= ratio <= 1 and _num(width) and width >= 1) or \
        v.get("seeding_scheme", "lefthash") not in ("selfhash", "lefthash")


def _set_as_attribute(arg: str, g: dict, m: int) -> bool:
    """A generate() argument validate finds on the config (``hasattr``, null too): __init__ sets a key it does not
    know as an attribute, except in a config marked ``_from_model_config`` (both lines)."""
    return arg in (GENERATE_ARGUMENTS_4 if m < 5 else GENERATE_ARGUMENTS) and not g.get("_from_model_config")


def _sampling(g) -> bool:
    return bool(g.get("do_sample"))  # generate samples for any true value, a string "false" included


def _too_many(v, g, m) -> bool:
    """validate's check of num_return_sequences ``v``: greedy gives one sequence, beam search at most num_beams.
    5.x checks a value above 1 (``not do_sample``: a null do_sample is greedy); 4.57 any value but 1, null
    included (``do_sample is False``: its default, a null do_sample is not). A string fails the comparison."""
    if v is not None and not _num(v):
        return True
    beams, sample = g.get("num_beams", 1), g.get("do_sample", False if m < 5 else None)
    if m >= 5:
        if not (v is not None and v > 1):
            return False
        return not sample if beams is None or beams == 1 else not _num(beams) or v > beams
    if v == 1:
        return False
    return sample is False if beams == 1 else v is None or not _num(beams) or v > beams


@dataclass(frozen=True)
class Rule:
    key: str
    stage: str  # load | generate | misread | tokenizer (SAID)
    wrong: Callable  # (value, generation dict, major version) -> bool; the key is present and not null
    what: str  # what transformers does with it
    repair: Callable | str  # (value, generation, config.json) -> the new value, DROP or LEFT; or DROP / LEFT
    edit: str = ""  # what the user writes instead, when no repair is obvious
    null: Callable = lambda g, m: False  # (generation dict, major) -> whether a JSON null is refused too (then dropped)


RULES = (
    Rule("early_stopping", "load", lambda v, g, m: v not in (True, False, "never"),
         "validate raises ValueError (a boolean or \"never\")", _bool, "true, false or \"never\" (beam search only)",
         null=lambda g, m: m < 5),  # 4.57: None is not in {True, False, "never"}
    Rule("max_new_tokens", "load", lambda v, g, m: not (_num(v) and v > 0),
         "validate raises (ValueError: greater than 0; TypeError for a string)", _whole(1, DROP),
         "a positive integer, or remove it"),
    Rule("pad_token_id", "load", lambda v, g, m: not _num(v), "validate compares it with 0: TypeError",
         _config_id("pad_token_id"), "the pad token's integer id"),
    Rule("num_return_sequences", "load",
         lambda v, g, m: _too_many(v, g, m),
         "validate raises ValueError (greedy decoding gives one sequence; beam search at most num_beams)", DROP,
         null=lambda g, m: m < 5 and _too_many(None, g, m)),
    Rule("cache_implementation", "load", lambda v, g, m: v not in CACHE_IMPLEMENTATIONS[4 if m < 5 else 5],
         "validate raises ValueError (not a cache this transformers knows)", DROP),
    Rule("compile_config", "load", lambda v, g, m: True,
         "validate raises ValueError (a CompileConfig object only; save_pretrained never writes it)", DROP),
    Rule("watermarking_config", "load", lambda v, g, m: _watermark_wrong(v),
         "WatermarkingConfig raises (keys: " + ", ".join(WATERMARK_KEYS) + "; greenlist_ratio in [0, 1], "
         "context_width >= 1, seeding_scheme lefthash or selfhash)", LEFT,
         "remove it (a trained checkpoint does not watermark), or correct its keys"),
    *(Rule(arg, "load", lambda v, g, m, arg=arg: _set_as_attribute(arg, g, m),
           "validate raises ValueError (an argument of generate(), never of a config)", DROP,
           null=lambda g, m, arg=arg: _set_as_attribute(arg, g, m))
      for arg in GENERATE_ARGUMENTS_4),
    Rule("num_beams", "generate", lambda v, g, m: not (_int(v) and v >= 1) and v != 1,
         "beam search divides and repeats by it: ZeroDivisionError or TypeError", _whole(1, DROP),
         "a positive integer (1: no beam search)"),
    Rule("bos_token_id", "generate", lambda v, g, m: not (_num(v) or isinstance(v, list) and all(map(_num, v))),
         "generate makes a tensor of it: TypeError", _config_id("bos_token_id"), "the BOS token's integer id, or remove it"),
    Rule("repetition_penalty", "generate", lambda v, g, m: v != 1 and not (isinstance(v, float) and v > 0),
         "RepetitionPenaltyLogitsProcessor takes a float above 0 (an integer other than 1 too raises ValueError)",
         _float_over_zero, "a float above 0 (1.0: no penalty)"),
    Rule("temperature", "generate",
         lambda v, g, m: _sampling(g) and v != 1 and not isinstance(v, float) and not (_num(v) and v <= 0),
         "sampling: TemperatureLogitsWarper takes a float above 0 (an integer other than 1 raises ValueError)",
         _float_over_zero, "a float above 0"),
    Rule("top_k", "generate", lambda v, g, m: _sampling(g) and v != 0 and not (_int(v) and v > 0),
         "sampling: TopKLogitsWarper takes an integer above 0 (0: no top-k)", _whole(0), "an integer, 0 for none"),
    Rule("top_p", "generate", lambda v, g, m: _sampling(g) and not (_num(v) and v >= 0),
         "sampling: TopPLogitsWarper compares it with 0 and 1 (ValueError below 0, TypeError for a string)",
         lambda v, g, c: x if (x := _parsed(v)) is not None and x >= 0 else LEFT, "a number in [0, 1]"),
    Rule("typical_p", "generate", lambda v, g, m: _sampling(g) and not (_num(v) and v > 0),
         "sampling: TypicalLogitsWarper takes a mass in (0, 1)", LEFT, "a number in (0, 1], or remove it"),
    Rule("min_p", "generate", lambda v, g, m: _sampling(g) and not (_num(v) and 0 <= v <= 1),
         "sampling: MinPLogitsWarper takes a number in [0, 1]", LEFT, "a number in [0, 1], or remove it"),
    *(Rule(key, "generate", lambda v, g, m, key=key: isinstance(v, str) and (key not in SAMPLED_NUMBERS or _sampling(g)),
           "plain generate compares it with a number or builds a logits processor of it: TypeError or ValueError",
           lambda v, g, c: x if (x := _parsed(v)) is not None else LEFT, "a number")
      for key in PROCESSOR_NUMBERS),
    Rule("do_sample", "misread", lambda v, g, m: isinstance(v, str) and bool(v) and _bool(v, g, {}) is False,
         "generate samples for any true value: a non-empty string, \"false\" too", _bool, "true or false"),
    Rule("stop_strings", "tokenizer", lambda v, g, m: True,
         "StopStringCriteria needs the tokenizer (ValueError without it)", LEFT,
         "pass tokenizer= to generate, or remove it (vlmfast stops on the EOS list)"),
)


@dataclass(frozen=True)
class Refused:
    """One value a rule refuses: its ``rule``, the saved ``value`` and the repair (a value, DROP or LEFT)."""

    rule: Rule
    value: object
    repair: object

    @property
    def key(self) -> str:
        return self.rule.key

    def said(self) -> str:
        return f"{self.key} {self.value!r}"


def refused_values(generation: dict | None, config: dict | None = None, major: int | None = None) -> list[Refused]:
    """Every value of generation_config.json (``generation``) a rule refuses, in RULES' order. ``major``:
    the transformers line to judge for (default: the installed one, read without importing it)."""
    if not isinstance(generation, dict):
        return []
    if major is None:
        from vlmfast.checkpoints.families import installed_transformers

        major = (installed_transformers() or (5,))[0]
    out = []
    for rule in RULES:
        if rule.key not in generation:
            continue
        value = generation[rule.key]
        if value is None:
            if rule.null(generation, major):  # a null the line refuses: without the key, its default
                out.append(Refused(rule, None, DROP))
            continue
        if rule.wrong(value, generation, major):
            out.append(Refused(rule, value, rule.repair(value, generation, config or {}) if callable(rule.repair) else rule.repair))
    return out


def _repair_said(r: Refused) -> str:
    return f"{r.key} dropped" if r.repair == DROP else f"{r.key} {r.value!r} -> {r.repair!r}"


def refused_findings(config: dict, generation: dict | None, fix_cmd: str) -> list[Finding]:
    """doctor's findings: ``generation-value-refused`` (error: transformers' load or plain generate raises; a
    warning for ``stop_strings``, which needs ``tokenizer=``) and ``generation-value-misread`` (warning)."""
    out = []
    for r in refused_values(generation, config):
        code = "generation-value-misread" if r.rule.stage == "misread" else "generation-value-refused"
        fix = f"{fix_cmd} ({_repair_said(r)})" if r.repair != LEFT else f"edit generation_config.json: {r.rule.edit}"
        out.append(Finding(SEVERITY[r.rule.stage], code, f"generation_config.json: {r.key}",
                           f"{r.said()}: {SAID[r.rule.stage]} ({r.rule.what}); vlmfast infer {_infer_said(r)}", fix))
    return out


def _infer_said(r: Refused) -> str:
    if r.rule.stage == "load":
        return "refuses the checkpoint"
    if r.key == "repetition_penalty":  # vlmfast applies the checkpoint's penalty, as generate and vLLM do
        return ("applies it as the number it is" if _parsed(r.value) is not None and _parsed(r.value) > 0 else
                "refuses it unless --repetition-penalty is given")
    return "does not apply it"


def _hint(d: Path, refused: list[Refused]) -> str:
    fixed = [_repair_said(r) for r in refused if r.repair != LEFT]
    edits = [f"{r.key}: {r.rule.edit}" for r in refused if r.repair == LEFT]
    return "; ".join(([f"vlmfast fix {d} ({', '.join(fixed)})"] if fixed else []) +
                     ([f"edit {d / 'generation_config.json'} ({'; '.join(edits)})"] if edits else []))


def refuse_unloadable(directory) -> None:
    """CheckpointError naming generation_config.json's values that stop transformers loading the model (``load`` rules),
    with ``vlmfast fix`` or what to edit; before the model loads, instead of transformers' ValueError or TypeError."""
    from vlmfast.checkpoints.readers import maybe_json, read_json_object

    d = Path(directory)
    if not (d / "generation_config.json").is_file():
        return
    generation = read_json_object(d / "generation_config.json")
    refused = [r for r in refused_values(generation, maybe_json(d / "config.json")) if r.rule.stage == "load"]
    if refused:
        raise CheckpointError(f"{d / 'generation_config.json'}: {', '.join(r.said() for r in refused)}: {SAID['load']}: "
                         + "; ".join(f"{r.key}: {r.rule.what}" for r in refused), hint=_hint(d, refused))


def ignored_notes(generation: dict | None, config: dict | None) -> list[str]:
    """infer's notes on the values plain generate refuses or misreads that vlmfast does not apply (both decoders:
    ``--decoder hf`` passes its own num_beams, sampling settings, stop list and BOS to generate)."""
    said = [r.said() for r in refused_values(generation, config)
            if r.rule.stage != "load" and r.key != "repetition_penalty"]
    return [f"generation_config.json sets {', '.join(said)}, which plain generate refuses or misreads (vlmfast doctor "
            "says how); vlmfast does not apply them: its --temperature, --top-p and EOS list decide"] if said else []


def repair_refused(config: dict, generation: dict) -> list[str]:
    """fix's repairs, in place on ``generation``: each value with one obvious repair (a number written as a string
    or as an integer where transformers takes a float, a ``true``/``false`` string, an id from config.json, a
    key transformers refuses and generate does not need); one change line each. The rest are left: doctor's
    findings say what to edit."""
    changes = []
    for _ in RULES:  # again on the repaired values until none is left to repair: do_sample "false" made false
        repairs = [r for r in refused_values(generation, config) if r.repair != LEFT]  # refuses num_return_sequences 2
        for r in repairs:
            if r.repair == DROP:
                del generation[r.key]
            else:
                generation[r.key] = r.repair
            changes.append(f"generation_config.json: {_repair_said(r)} ({CHANGED[r.rule.stage]})")
        if not repairs:
            break
    return changes
