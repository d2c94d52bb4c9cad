"""doctor's findings on a checkpoint's weights: an adapter's weight file cut short, two sets of weight files,
an LM head saved while config.json ties it, the tensors the model class expects against the saved ones, and
the saved ones against a base's (:mod:`vlmfast.checkpoints.weights`); the embedding's rows against the vocabulary."""

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
    from vlmfast.checkpoints.readers import incomplete_said, tensor_index
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
    if check is not None and check.missing and incomplete_said(d) is None:  # a shard absent or cut: weights-incomplete
        head = (" (tie_word_embeddings is false: the LM head is its own matrix, and the save lost it)"
                if check.head_lost else "")
        out.append(Finding("error", "weights-lost", "*.safetensors",
                           f"{sum(g.count for g in check.missing)} of {check.expected} tensors the model class expects "
                           f"are not saved: {', '.join(f'{g.label}: {g.count} missing' for g in check.missing)}{head}; "
                           "transformers would initialise them at random and say so only in its load log",
                           fix_hint(check, d)))
    if check is not None and check.mismatched:
        shown = "; ".join(f"{n}: {s} saved, {e} expected" for n, s, e in check.mismatched[:3])
        empty = (f"{check.placeholders} of them saved empty (shape [0]): DeepSpeed ZeRO-3's placeholders, the weights "
                 "left in its shards; " if check.placeholders else "")
        out.append(Finding("error", "weights-shape-mismatch", "*.safetensors",
                           f"{len(check.mismatched)} tensor(s) have another shape than config.json gives: {empty}{shown}",
                           fix_hint(check, d)))
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


def embed_rows(index: dict) -> tuple[str, int] | None:
    for name, (_, shape, _) in index.items():
        if name.endswith("embed_tokens.weight") and "visual" not in name:
            return name, shape[0]
    return None


def vocab_findings(d: Path, config: dict, base_dir: Path | None, base_cfg: dict | None) -> list[Finding]:
    """The saved embedding's rows against config.json's vocab_size, and with a base, the vocabulary and the
    head's tying against the base's."""
    from vlmfast.checkpoints.readers import tensor_index, text_setting

    out = []
    vocab = text_setting(config, "vocab_size")
    try:
        index, base_index = tensor_index(d), (tensor_index(base_dir) if base_dir else {})
    except (OSError, ValueError, KeyError, TypeError):
        index, base_index = {}, {}  # reported by _weights
    embed = embed_rows(index)
    if embed and vocab and embed[1] != vocab and embed[1] != 0:  # 0 rows: ZeRO-3's placeholder, said with the weights
        out.append(Finding("error", "vocab-mismatch", "config.json: vocab_size",
                           f"vocab_size {vocab} but {embed[0]} has {embed[1]} rows: the model will not load",
                           "set vocab_size to the embedding's row count, or re-save the model"))
    if base_cfg is None:
        return out
    base_vocab, base_embed = text_setting(base_cfg, "vocab_size"), embed_rows(base_index)
    mine, theirs = (embed[1] if embed else vocab), (base_embed[1] if base_embed else base_vocab)
    if mine and theirs and mine != theirs:
        out.append(Finding("warning", "vocab-differs-from-base", "config.json: vocab_size",
                           f"embedding/vocabulary size {mine} differs from the base's {theirs}: tokens were added or "
                           "the wrong base is compared", "check the tokenizer files match these weights (compare added_tokens)"))
    tie, base_tie = text_setting(config, "tie_word_embeddings"), text_setting(base_cfg, "tie_word_embeddings")
    head, base_head = "lm_head.weight" in index, "lm_head.weight" in base_index
    if (tie is not None and base_tie is not None and tie != base_tie) or (index and base_index and head != base_head):
        out.append(Finding("warning", "tie-embeddings-differs-from-base", "config.json: tie_word_embeddings",
                           f"tie_word_embeddings {tie} (lm_head saved: {head}) but the base has {base_tie} "
                           f"(lm_head saved: {base_head}): the output layer may be the wrong matrix",
                           "set tie_word_embeddings as in the base's config.json"))
    return out
