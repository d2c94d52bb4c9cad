"""What a checkpoint's generation config asks of a run, and what the engines apply of it — the same notes
from vlmfast's engine and from vLLM's, which is handed explicit sampling parameters and so applies the
config's repetition penalty (vlmfast passes it) and nothing else of it."""

from __future__ import annotations

from vlmfast.errors import CheckpointError

# generation-config settings plain generate turns into logits processors that vlmfast's loop does not apply,
# with the value that leaves them off
UNAPPLIED = {"no_repeat_ngram_size": 0, "bad_words_ids": None, "sequence_bias": None, "min_length": 0,
             "encoder_repetition_penalty": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}
# ... and those neither decoder applies (--decoder hf hands generate vlmfast's own stop and ban lists and length)
NEVER_APPLIED = {"min_new_tokens": None, "suppress_tokens": None, "begin_suppress_tokens": None,
                 "forced_bos_token_id": None, "forced_eos_token_id": None, "exponential_decay_length_penalty": None}
# sampling settings of the generation config: a run samples with --temperature and --top-p alone
UNSAMPLED = {"top_k": (None, 0, 50), "min_p": (None, 0.0), "typical_p": (None, 1.0)}


def generation_config_processors(config, decoder: str, wanted: float | None = None, sampling: bool = False,
                                 where="the checkpoint's generation_config.json") -> tuple[float, list[str]]:
    """The repetition penalty a run applies (1.0: none): ``wanted`` (``--repetition-penalty``), else the
    checkpoint's (``config``: its GenerationConfig), as plain generate and vLLM apply it — Qwen2-VL and Qwen2.5-VL
    Instruct checkpoints ship 1.05, and runs trained from them keep it; and notes naming it and any setting of
    the generation config the run does not apply. ``decoder``: "vlmfast", "hf" (plain generate) or "vllm".
    A saved penalty that is no number above 0 (plain generate raises on it; 0 meant none here before) is a
    CheckpointError (a sweep goes on without the checkpoint) naming ``where`` (its file), unless ``wanted`` replaces it."""
    saved = getattr(config, "repetition_penalty", None)
    if wanted is None and saved is not None and not _above_zero(saved):
        raise CheckpointError(f"{where}: repetition_penalty {saved!r}: plain generate refuses it (RepetitionPenaltyLogitsProcessor "
                         "takes a float above 0)", hint="pass --repetition-penalty (1: none), or edit the file: a float "
                         "above 0, 1.0 for none (vlmfast doctor names every such value)")
    theirs = float(saved) if saved is not None and _above_zero(saved) else 1.0
    penalty = theirs if wanted is None else float(wanted)
    notes = []
    if wanted is None and penalty != 1.0:
        notes.append(f"repetition penalty {penalty:g} from the checkpoint's generation config (as plain generate and "
                     "vLLM apply it; --repetition-penalty 1 turns it off)")
    elif wanted is not None and penalty != theirs:
        notes.append(f"--repetition-penalty {penalty:g} over the checkpoint's generation config ({theirs:g})")

    def set_(names: dict) -> list[str]:
        return [f"{name}={getattr(config, name)!r}" for name, off in names.items()
                if getattr(config, name, None) not in (off if isinstance(off, tuple) else (off, None))]

    if (unapplied := set_(UNAPPLIED)) and decoder != "hf":  # "vlmfast" or "vllm"
        notes.append(f"the generation config sets {', '.join(unapplied)}, which "
                     + ("vlmfast's decoder does not apply (plain generate does: --decoder hf)" if decoder == "vlmfast"
                        else "vLLM does not apply as vlmfast runs it (its own sampling settings)"))
    if never := set_(NEVER_APPLIED) + (set_(UNSAMPLED) if sampling else []):
        notes.append(f"the generation config sets {', '.join(never)}, which vlmfast does not apply (its EOS list, "
                     "--max-new-tokens, --temperature and --top-p decide; the vision placeholders alone are suppressed)")
    return penalty, notes


def _above_zero(value) -> bool:
    """A number above 0, or a string of one (vlmfast applies it as that number; fix writes it as one)."""
    try:
        return not isinstance(value, bool) and float(value) > 0
    except (TypeError, ValueError):
        return False
