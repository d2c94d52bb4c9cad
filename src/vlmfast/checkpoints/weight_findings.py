"""doctor's findings on a checkpoint's weights: an adapter's weight file cut short, two sets of weight files,
an LM head saved while config.json ties it, the tensors the model class expects against the saved ones, and
the saved ones against a base's (:mod:`vlmfast.checkpoints.weights`)."""

from __future__ import annotations

from pathlib import Path

from vlmfast.checkpoints.findings import Finding


def adapter_findings(d: Path) -> list[Finding]:
    """doctor's findings on an adapter dir's weights: ``weights-incomplete`` naming its weight file when that
    is cut short, corrupt or absent (peft's error on it would read like a wrong base)."""
    from vlmfast.checkpoints.lora import ADAPTER_FIX
    from vlmfast.checkpoints.readers import incomplete_adapter

    said = incomplete_adapter(d)
    return [Finding("error", "weights-incomplete", str(d), f"the adapter's weights are incomplete: {said}",
                    ADAPTER_FIX)] if said else []


def whole_findings(target, config: dict, base_dir: Path | None) -> list[Finding]:
    """doctor's whole-weights findings: two sets of weight files, an LM head saved while config.json ties
    it, the tensors the model class expects (built on the meta device) against the saved ones (those
    transformers loads), and with ``--base``, the saved ones against the base's."""
    from vlmfast.checkpoints.config_family import family_mismatch
    from vlmfast.checkpoints.readers import tensor_index
    from vlmfast.checkpoints.weights import check_weights, compare_with_base, fix_hint

    if target.kind != "model":
        return []
    d = target.path
    out = _two_sets(d)
    try:
        index = tensor_index(d)
        base_index = tensor_index(base_dir) if base_dir else {}
    except (OSError, ValueError, KeyError, TypeError):
        return out  # reported by _weights
    check = check_weights(d, config, index)
    mismatch = family_mismatch(d, config, index)
    if mismatch is not None:  # config.json of another model: its class's lost and unexpected tensors say no more
        return out + [mismatch.finding(check, base_dir)]
    out += _tied_head(d, config, check)
    if check is not None and check.missing:
        head = (" (tie_word_embeddings is false: the LM head is its own matrix, and the save lost it)"
                if check.head_lost else "")
        out.append(Finding("error", "weights-lost", "*.safetensors",
                           f"{sum(g.count for g in check.missing)} of {check.expected} tensors the model class expects "
                           f"are not saved: {', '.join(f'{g.label}: {g.count} missing' for g in check.missing)}{head}; "
                           "transformers would initialise them at random and say so only in its load log",
                           fix_hint(check)))
    if check is not None and check.mismatched:
        shown = "; ".join(f"{n}: {s} saved, {e} expected" for n, s, e in check.mismatched[:3])
        out.append(Finding("error", "weights-shape-mismatch", "*.safetensors",
                           f"{len(check.mismatched)} tensor(s) have another shape than config.json gives: {shown}",
                           fix_hint(check)))
    if check is not None and check.unexpected:
        out.append(Finding("warning", "weights-unexpected", "*.safetensors",
                           "saved tensors the model class does not take (dropped on load): "
                           + ", ".join(f"{g.label}: {g.count}" for g in check.unexpected[:5]),
                           "check the checkpoint was saved from this model class (config.json: architectures)"))
    differs = compare_with_base(index, base_index) if base_index else None
    if differs:
        out.append(Finding("warning", "weights-differ-from-base", "*.safetensors",
                           f"the tensors differ from the base's: {differs}",
                           "tensors the base has and this save lacks were lost or are ignored by this model class: "
                           "compare with the base's index before trusting an evaluation"))
    return out


def _two_sets(d: Path) -> list[Finding]:
    """``model.safetensors`` beside a sharded set (:mod:`vlmfast.checkpoints.weight_files`)."""
    from vlmfast.checkpoints.weight_files import SAFE_INDEX, SAFE_SINGLE, two_sets_said

    said = two_sets_said(d)
    return [Finding("error", "weights-two-sets", f"{SAFE_SINGLE}, {SAFE_INDEX}", said[0] + "; vlmfast infer and sweep "
                    "refuse it", said[1])] if said else []


def _tied_head(d: Path, config: dict, check) -> list[Finding]:
    """``lm_head.weight`` saved while config.json (or the class, with no key) ties it (:mod:`vlmfast.checkpoints.heads`)."""
    from vlmfast.checkpoints.heads import saved_head

    try:
        head = saved_head(d, config, tied_by_class=bool(check is not None and check.tied_head))
    except (OSError, ValueError, KeyError, TypeError):
        return []  # an unreadable header: reported by _weights
    if head is None:
        return []
    where = ", ".join(head.places) or "config.json: tie_word_embeddings"
    if head.equal:
        return [Finding("info", "tied-head-saved", where, head.what(), head.fix())]
    return [Finding("error", "tied-head-saved", where, head.what() + "; vlmfast infer runs the saved head on either "
                    "transformers line (the vLLM engine refuses the checkpoint)", head.fix())]
