"""A saved LM head while config.json says the head is tied to the input embedding.

``save_pretrained`` drops a tied head (it is the embedding), so ``lm_head.weight`` in the files of a
checkpoint whose ``tie_word_embeddings`` is true means the config and the weights disagree. The two
transformers lines resolve it differently: 4.57 ties after loading, so the embedding replaces the saved
head without a word (``tie_embeddings_and_encoder_decoder``, reading ``text_config``); 5.x keeps both when
their values differ and only logs a warning (``tie_weights``, reading the top level or ``text_config``).
vLLM ties too. One checkpoint then decodes differently per line and engine. A saved head with the
embedding's exact values (a merger that wrote both names) changes nothing.

A head whose values differ from the embedding's was trained as its own matrix: a tied model has no such
head to save. The model the trainer ran used it, so :func:`untie_saved_head` has ``infer`` run it untied
on either transformers line, and the vLLM engine, which would tie it, refuses the checkpoint.

Files only (safetensors headers, and the two tensors' bytes when both are saved); torch only in
:func:`untie_saved_head`, on a model already loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HEAD = "lm_head.weight"
CHUNK = 1 << 16
SAMPLES = 16  # windows compared between a saved head and the embedding


def tie_places(config: dict) -> list[str]:
    """Where config.json sets ``tie_word_embeddings`` true, as ``config.json: key`` strings."""
    found = ["config.json: tie_word_embeddings"] if config.get("tie_word_embeddings") is True else []
    text = config.get("text_config")
    if isinstance(text, dict) and text.get("tie_word_embeddings") is True:
        found.append("config.json: text_config.tie_word_embeddings")
    return found


@dataclass(frozen=True)
class SavedHead:
    """``lm_head.weight`` saved while tying is configured. ``equal``: whether it holds the embedding's exact
    values (same dtype, shape and bytes); ``places``: where config.json ties (empty: the class's default)."""

    places: tuple[str, ...]
    embedding: str | None  # the embedding's saved name
    equal: bool
    head_file: Path | None = None  # the safetensors file holding lm_head.weight
    v4_ties: bool = True  # transformers 4.57 reads text_config's setting (the top level's in a flat config)

    def what(self) -> str:
        where = " and ".join(p.split(": ", 1)[1] for p in self.places) or "the model class's default"
        if self.equal:
            return (f"{HEAD} is saved although tie_word_embeddings is true ({where}), with the exact values of "
                    f"{self.embedding}: tied or not, the model computes the same")
        v4 = ("transformers 4.57 ties the head to the embedding and silently discards the saved one" if self.v4_ties
              else "transformers 4.57 reads text_config's false and keeps it")
        return (f"tie_word_embeddings is true ({where}) but the weights hold {HEAD} with other values than "
                f"{self.embedding or 'the input embedding'}: {v4}, transformers 5.x keeps the saved head (logging a "
                "warning), vLLM ties it, so the checkpoint decodes differently per line and engine; a tied model has "
                "no separate head to save, so the trainer ran this one")

    def fix(self) -> str:
        if self.equal:
            return f"nothing needed; dropping {HEAD} from the weights saves its space"
        return (f"if the head was trained as its own matrix (a differing {HEAD} says so), set tie_word_embeddings to "
                "false in config.json (top level and text_config); if the head is a leftover and the model is meant "
                f"to be tied, drop {HEAD} from the weights")


def saved_head(d, config: dict, tied_by_class: bool = False) -> SavedHead | None:
    """The :class:`SavedHead` of the checkpoint in ``d`` when its loaded safetensors hold ``lm_head.weight`` while
    config.json (or, with no key, the model class: ``tied_by_class``) ties it; else None. Raises OSError /
    ValueError on an unreadable file."""
    places = tie_places(config)
    if not places and not tied_by_class:
        return None
    found = _locate(Path(d))
    if HEAD not in found:
        return None
    embedding = next((n for n in found if _is_embedding(n)), None)
    text = config.get("text_config")
    v4_ties = (text.get("tie_word_embeddings") is True) if isinstance(text, dict) else bool(places) or tied_by_class
    return SavedHead(tuple(places), embedding, embedding is not None and _same(found[HEAD], found[embedding]),
                     found[HEAD][0], v4_ties)


def _is_embedding(name: str) -> bool:
    from vlmfast.checkpoints.weight_files import canonical

    return canonical(name) == "embed_tokens.weight"


def _locate(d: Path) -> dict[str, tuple[Path, str, tuple, int, int]]:
    """name → (file, dtype, shape, absolute start, length) for the head and the embedding."""
    from vlmfast.checkpoints.readers import _safetensors_head
    from vlmfast.checkpoints.weight_files import loaded_safetensors

    found = {}
    for file in loaded_safetensors(d):
        if not file.is_file():
            continue
        size, header = _safetensors_head(file)
        for name, meta in header.items():
            if name == HEAD or (name != "__metadata__" and _is_embedding(name)):
                begin, end = (int(x) for x in meta["data_offsets"])
                found[name] = (file, meta["dtype"], tuple(meta["shape"]), 8 + size + begin, end - begin)
    return found


def _same(a, b) -> bool:
    """Whether two saved tensors hold the same bytes, by :data:`SAMPLES` windows of :data:`CHUNK` bytes spread
    over them (a 3B model's embedding and head are 1.2 GB together, and doctor, every load and every swap of a
    sweep ask): a trained head differs from the embedding everywhere, a merger's copy nowhere."""
    if a[1:3] != b[1:3] or a[4] != b[4]:
        return False
    size = a[4]
    starts = sorted({min(size - min(CHUNK, size), k * size // SAMPLES) for k in range(SAMPLES)} | {max(0, size - CHUNK)})
    with open(a[0], "rb") as fa, open(b[0], "rb") as fb:
        for start in starts:
            fa.seek(a[3] + start)
            fb.seek(b[3] + start)
            n = min(CHUNK, size - start)  # not past the tensor's end
            if fa.read(n) != fb.read(n):
                return False
    return True


def untie_saved_head(model, found) -> str | None:
    """For the HF loader, on the loaded ``model`` of the located checkpoint ``found``: when the load tied the
    head to the embedding (4.57 on a config that ties) and the files save a head with other values, the
    saved head is put back as its own matrix and the config untied, so greedy tokens are the ones of the
    model the trainer ran (and the same on 4.57 as on 5.x, which keeps it). The note saying so, or None."""
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out_emb is None or in_emb is None or found is None or not found.is_local or found.kind != "model":
        return None
    tied = out_emb.weight is in_emb.weight
    from vlmfast.checkpoints.readers import maybe_json

    try:
        head = saved_head(found.path, maybe_json(Path(found.path) / "config.json"), tied_by_class=tied)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if head is None or head.equal or head.head_file is None:
        return None
    if tied:
        import torch
        from safetensors import safe_open

        with safe_open(str(head.head_file), framework="pt", device="cpu") as f:
            saved = f.get_tensor(HEAD)
        out_emb.weight = torch.nn.Parameter(saved.to(dtype=in_emb.weight.dtype, device=in_emb.weight.device),
                                            requires_grad=False)
        done = "tied it to the embedding on load; vlmfast put the saved head back (transformers 5.x keeps it)"
    else:
        done = "kept the saved head" + (", as 4.57 would not (it ties it to the embedding)" if head.v4_ties else "")
    for config in {id(c): c for c in (model.config, model.config.get_text_config(decoder=True))}.values():
        config.tie_word_embeddings = False  # a later tie_weights() must not tie it again
    if isinstance(getattr(model, "all_tied_weights_keys", None), dict):
        model.all_tied_weights_keys.pop(HEAD, None)
    return (f"config.json ties the LM head to the embedding, but {HEAD} is saved with its own values, so the trainer "
            f"ran that head: transformers {_version()} {done}; vlmfast doctor says how to make the config agree")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return "?"


def refuse_for_vllm(found) -> None:
    """For the vLLM engine, which ties whatever the files hold: a CheckpointError (exit 2) when the checkpoint
    saves a head that differs from its tied embedding."""
    if found is None or not found.is_local or found.kind != "model":
        return
    from vlmfast.checkpoints.readers import maybe_json
    from vlmfast.errors import CheckpointError

    try:
        head = saved_head(found.path, maybe_json(Path(found.path) / "config.json"))
    except (OSError, ValueError, KeyError, TypeError):
        return
    if head is not None and not head.equal:
        raise CheckpointError(f"{found.path}: {head.what()}; vLLM would run the embedding as the head instead",
                              hint=f"{head.fix()}; or run it with --engine hf")
