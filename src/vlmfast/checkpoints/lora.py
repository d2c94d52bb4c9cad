"""LoRA adapter directories (ms-swift, PEFT): recognise them, name their base, load them with peft.

An adapter dir holds ``adapter_config.json`` + ``adapter_model.safetensors``; its base is named in
``base_model_name_or_path`` (a hub id, or the path the trainer loaded it from). peft is imported inside
functions so that recognising an adapter costs nothing. The loader (:mod:`vlmfast.checkpoints.load`) and the
merger (:mod:`vlmfast.checkpoints.fix`) use these pieces; this module loads no model itself.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from vlmfast.checkpoints.readers import ADAPTER_CONFIG, adapter_base_or_none, has_processor_config, incomplete_adapter
from vlmfast.errors import CheckpointError
from vlmfast.checkpoints.locate import HUB_ID, Located, locate, require

# What makes an adapter dir's own processor usable instead of the base's.
_TOKENIZER_FILES = ("tokenizer.json", "vocab.json")


def adapter_base(path, option: str = "--base") -> str:
    """The base model the adapter was trained on, as adapter_config.json names it (``option``: the command's
    option that names a base, for the hint)."""
    base = adapter_base_or_none(path)
    if base is None:
        raise CheckpointError(
            f"{path}: {ADAPTER_CONFIG} does not name its base model (base_model_name_or_path)",
            hint=f"pass the base model explicitly ({option} BASE)",
        )
    return base


def resolve_base(adapter_dir, base: str | None = None, option: str = "--base") -> str:
    """``base`` when given, else the adapter's named base; CheckpointError when the named base is a
    local path that is not here (trainers record the path they loaded it from). ``option``: the command's
    option that names a base (``infer --base``, ``fix --processor-from``), for the hint."""
    spec = base or adapter_base(adapter_dir, option)
    if base is None and not Path(spec).expanduser().exists() and not HUB_ID.match(spec):
        raise CheckpointError(
            f"{adapter_dir}: its base {spec!r} (from {ADAPTER_CONFIG}) does not exist here",
            hint=f"pass the base model explicitly ({option} BASE): a local copy or a hub id",
        )
    return spec


def locate_base(adapter_dir, base: str | None = None, option: str = "--base") -> Located:
    """The base an adapter runs on, located (a full model or a hub id, probed once): ``base`` when given, its errors
    led by ``option``; else the one adapter_config.json names, whose errors name the adapter, where the base came
    from, and ``option`` with a local copy (a hub id the hub cannot give here is not the user's words to fix)."""
    spec = resolve_base(adapter_dir, base, option)
    if base is not None:
        return require(locate(spec, hub=True, option=option), "model", "hub")
    try:
        return require(locate(spec, hub=True), "model", "hub")  # not another adapter
    except CheckpointError as exc:
        said = exc.message.removeprefix(f"{spec}: ")
        raise CheckpointError(f"{adapter_dir}: its base {spec!r} (from {ADAPTER_CONFIG}): {said}",
                              hint=f"pass the base model explicitly ({option} LOCAL_DIR, a local copy of it); "
                                   f"{exc.hint}" if exc.hint else f"pass the base model explicitly ({option} LOCAL_DIR)"
                              ) from exc


ADAPTER_FIX = ("the adapter file was cut short or is damaged (a copy or save that did not finish): save the adapter "
               "again (save_pretrained), or copy adapter_model.safetensors whole from where it was trained")


def require_adapter_whole(adapter_dir) -> None:
    """A CheckpointError naming the adapter's weight file when it is not whole (cut short, corrupt, absent),
    from the file alone and before any model loads: peft's own error on it would read like a wrong base."""
    said = incomplete_adapter(adapter_dir)
    if said is not None:
        raise CheckpointError(f"{adapter_dir}: the adapter's weights are incomplete: {said}", hint=ADAPTER_FIX)


def load_adapter_model(base_model, adapter_dir, merge: bool):
    """Apply the adapter in ``adapter_dir`` to an already loaded ``base_model`` with peft.

    ``merge=True`` folds the LoRA weights into the base weights (``merge_and_unload``: plain model,
    fastest decode). ``merge=False`` keeps the LoRA layers; we return peft's injected base model rather
    than the ``PeftModel`` wrapper, so ``generate`` is the model's own (peft's causal-LM wrapper
    re-prepares inputs and knows nothing of pixel_values). Both mutate ``base_model``.
    """
    require_adapter_whole(adapter_dir)
    try:
        from peft import PeftModel
    except ImportError as exc:
        raise CheckpointError("loading a LoRA adapter needs peft", hint="pip install peft") from exc
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", FutureWarning)  # 5.x: peft calls a deprecated checkpointing alias
            wrapped = PeftModel.from_pretrained(base_model, str(adapter_dir), is_trainable=False,
                                                key_mapping=key_mapping(base_model))
    except Exception as exc:
        raise CheckpointError(
            f"{adapter_dir}: cannot apply the adapter ({type(exc).__name__}: {exc})",
            hint="check that --base is the model the adapter was trained on (adapter_config.json names it)",
        ) from exc
    for w in said:
        text = str(w.message)
        if "missing adapter keys" in text:  # LoRA layers injected but left at their init (B = 0): the base's tokens
            keys = text.split(":", 1)[-1].strip()
            raise CheckpointError(
                f"{adapter_dir}: the adapter's weights do not fit the model's layers, so it would not be applied "
                f"(peft found no saved tensor for {keys[:300]})",
                hint="check that --base is the model the adapter was trained on (adapter_config.json names it)")
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)  # anything else: as before
    with warnings.catch_warnings():
        # peft re-checks tying on merge and, finding separate lm_head/embedding tensors (never tied in
        # memory), records tie_word_embeddings=False: that is the truth, not news for the user.
        warnings.filterwarnings("ignore", message="Input and output embeddings are no longer tied")
        model = wrapped.merge_and_unload() if merge else wrapped.get_base_model()
    model.eval()
    return model


# Qwen-VL adapters saved before transformers 4.52 name the language model ``model.layers.*`` and the vision
# tower ``visual.*``; the models now hold them under ``model.language_model`` and ``model.visual``. transformers
# 4.57 declares this renaming on the class (``_checkpoint_conversion_mapping``), which peft applies to the
# adapter's keys; 5.x declares it elsewhere, where peft does not look, so without this the adapter's saved
# tensors find no home and its LoRA layers stay at their init (the base's tokens).
QWEN_VL_KEY_MAPPING = {r"^visual": "model.visual", r"^model(?!\.(language_model|visual))": "model.language_model"}


def key_mapping(model) -> dict | None:
    """The renaming of an adapter's saved keys for ``model`` (peft's ``key_mapping``): the class's own when it
    declares one, else the Qwen-VL layout change for a model that holds ``model.language_model``."""
    own = getattr(model, "_checkpoint_conversion_mapping", None)
    if own:
        return own
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "language_model") and hasattr(inner, "visual"):
        return dict(QWEN_VL_KEY_MAPPING)
    return None


def has_own_processor(adapter_dir) -> bool:
    """Whether the adapter dir carries a processor (config + tokenizer) to use instead of the base's."""
    d = Path(adapter_dir)
    return has_processor_config(d) and any((d / f).is_file() for f in _TOKENIZER_FILES)
