"""generation_config.json values that load and save in transformers but break plain ``model.generate`` (the way
users check a checkpoint after vlmfast): doctor's findings on them and fix's repair of them.

What transformers does with them (read in ``transformers/generation/utils.py``, ``logits_process.py`` and
``configuration_utils.py`` of 4.57.6 and 5.24, and run on both):

- ``do_sample: true`` with ``temperature: 0`` (or below): ``GenerationConfig.from_pretrained``, ``validate`` and
  ``save_pretrained`` accept it; ``generate`` builds ``TemperatureLogitsWarper(0)``, which raises ValueError
  ("`temperature` (=0) has to be a strictly positive float") before the first token, on both lines.
- ``max_length`` without ``max_new_tokens``: 5.x ends every sequence at ``max_length`` tokens, prompt included,
  and raises ValueError ("Input length of input_ids is N, but `max_length` is set to L") when the prompt has L
  tokens or more. 4.57 does the same, except for exactly 20 (its default, written out): that it takes as no
  length given and generates 20 new tokens, with a UserWarning. A ``max_new_tokens`` (saved or passed) wins
  over ``max_length`` on both lines.

vlmfast's own engine applies neither: ``--temperature`` (0: greedy) and ``--max-new-tokens`` decide, and its
``--decoder hf`` passes ``max_new_tokens`` and its own ``do_sample``/``temperature`` to ``generate``.
"""

from __future__ import annotations

from vlmfast.checkpoints.families import family_of, installed_transformers
from vlmfast.checkpoints.findings import Finding
from vlmfast.checkpoints.generation_refused import refused_findings, repair_refused

# vlmfast's defaults (engines/prepare.py DEFAULT_MAX_PIXELS_CAP, engines/rows.py GenerationSettings.max_new_tokens):
# a max_length below one image at the pixel cap plus these new tokens cuts an answer vlmfast would give in full
DEFAULT_MAX_PIXELS_CAP = 1280 * 28 * 28
DEFAULT_MAX_NEW_TOKENS = 1024
TRANSFORMERS_DEFAULT_MAX_LENGTH = 20
# settings generate reads only when sampling: transformers' GenerationConfig.validate lists each as an issue
# beside do_sample false, and save_pretrained refuses a config it has to change (4.57: any config)
SAMPLING_ONLY = ("temperature", "top_p", "top_k", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def zero_temperature(generation: dict | None) -> bool:
    """Whether the saved generation config samples at a temperature of 0 or below: ``do_sample`` true, or any value
    generate takes as true (a string, "false" too)."""
    return isinstance(generation, dict) and bool(generation.get("do_sample")) and \
        _number(generation.get("temperature")) and generation["temperature"] <= 0


def image_tokens(config: dict) -> int:
    """The tokens of one image at vlmfast's default pixel cap: an image token covers (patch · 2)² pixels."""
    family = family_of(config)
    vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else {}
    patch = vision.get("patch_size") if _number(vision.get("patch_size")) else family.patch_size if family else 14
    return DEFAULT_MAX_PIXELS_CAP // (patch * 2) ** 2


def short_max_length(config: dict, generation: dict | None) -> int | None:
    """The saved ``max_length`` when plain generate takes it (no ``max_new_tokens``) and it is shorter than one
    image at vlmfast's default pixel cap plus vlmfast's default new tokens; None otherwise."""
    if not isinstance(generation, dict) or generation.get("max_new_tokens") is not None:
        return None
    length = generation.get("max_length")
    return length if _number(length) and length < image_tokens(config) + DEFAULT_MAX_NEW_TOKENS else None


def generation_value_findings(config: dict, generation: dict | None, fix_cmd: str) -> list[Finding]:
    """doctor's findings: ``sampling-temperature-zero`` (error: plain generate raises) and ``max-length-short``
    (error where the installed transformers' generate raises for a prompt of one image at vlmfast's default
    pixel cap, a warning where it cuts the answer), then the values transformers refuses or misreads
    (:mod:`vlmfast.checkpoints.generation_refused`). ``fix_cmd``: the ``vlmfast fix`` command for this dir."""
    out = []
    if zero_temperature(generation):
        out.append(Finding(
            "error", "sampling-temperature-zero", "generation_config.json: temperature",
            f"do_sample is true with temperature {generation['temperature']!r}: plain model.generate raises ValueError "
            "before the first token (its temperature warper takes only a positive temperature; loading and saving "
            "pass); vlmfast infer samples with its own --temperature (0: greedy)",
            f"{fix_cmd} (sets do_sample to false and drops the sampling-only settings: greedy, what temperature 0 "
            "means to vLLM and to the trainers' rollout settings)"))
    length = short_max_length(config, generation)
    if length is not None:
        out.append(_max_length_finding(config, length, fix_cmd))
    return out + refused_findings(config, generation, fix_cmd)


def _max_length_finding(config: dict, length: int, fix_cmd: str) -> Finding:
    image = image_tokens(config)
    major = (installed_transformers() or (5,))[0]
    said = f"max_length {length} without max_new_tokens: plain model.generate"
    if major < 5 and length == TRANSFORMERS_DEFAULT_MAX_LENGTH:
        sev, what = "warning", (f"{said} of this transformers (4.x) takes it as its default and stops after 20 new "
                                "tokens (a <think> answer is cut); transformers 5 ends at 20 tokens, prompt included, "
                                "and raises ValueError for a prompt of 20 tokens or more")
    elif length <= image:
        sev, what = "error", (f"{said} ends at {length} tokens, prompt included, and raises ValueError for a prompt "
                              f"of {length} tokens or more: one image at vlmfast's default pixel cap is {image} tokens")
    else:
        sev, what = "warning", (f"{said} ends at {length} tokens, prompt included: a prompt with one image at "
                                f"vlmfast's default pixel cap ({image} tokens) leaves at most {length - image} for "
                                f"the answer (vlmfast's default is {DEFAULT_MAX_NEW_TOKENS} new tokens)")
    return Finding(sev, "max-length-short", "generation_config.json: max_length", what,
                   f"{fix_cmd} (drops max_length: generate then stops where the max_new_tokens passed to it says)")


def repair_generation_values(config: dict, generation: dict) -> list[str]:
    """fix's repair, in place on ``generation`` (generation_config.json's object); one change line each.

    do_sample with temperature 0 becomes greedy (``do_sample: false``, the sampling-only settings dropped): the
    trainers mean greedy by it (vLLM, which EasyR1, verl and TRL roll out with, decodes greedily below a
    temperature of 1e-5), vlmfast's engine decodes greedily at ``--temperature 0`` and ignores the saved
    do_sample and temperature, and a positive temperature would be a guess. The sampling-only settings go
    too: beside ``do_sample: false`` transformers' validate lists each and ``save_pretrained`` refuses the
    config once changed (4.57: always); so does ``num_return_sequences`` above 1 without beams, with which
    transformers refuses even to load the config ("Greedy methods … do not support num_return_sequences"). A short ``max_length`` (:func:`short_max_length`) is dropped:
    generate then stops where the caller's ``max_new_tokens`` says (without one: transformers' default, 20 new
    tokens, with its warning to pass ``max_new_tokens``), not at a length no image prompt fits in."""
    changes = []
    if zero_temperature(generation):
        generation["do_sample"] = False
        changes.append("generation_config.json: do_sample true -> false (temperature 0: greedy)")
        for key in SAMPLING_ONLY:
            if key in generation:
                changes.append(f"generation_config.json: {key} {generation.pop(key)!r} dropped (sampling only)")
        several = generation.get("num_return_sequences")
        if _number(several) and several > 1 and generation.get("num_beams") in (None, 1):
            del generation["num_return_sequences"]  # several answers to one prompt are drawn: greedy has one, and
            changes.append(f"generation_config.json: num_return_sequences {several} dropped "  # transformers refuses
                           "(greedy decoding gives one answer)")  # to load the config with it (validate raises)
    length = short_max_length(config, generation)
    if length is not None:
        del generation["max_length"]
        changes.append(f"generation_config.json: max_length {length} dropped (shorter than a prompt and answer "
                       "need; generate's max_new_tokens decides)")
    return changes + repair_refused(config, generation)  # what transformers refuses, where one repair is obvious
