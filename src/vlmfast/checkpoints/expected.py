"""What a checkpoint's model class expects: its tensors' names and shapes, built from config.json on the meta
device (no memory, no weights read), and the names transformers' loader gives the saved tensors.

transformers 5 converts some saved tensors as it loads them (its checkpoint conversion mapping, per model
type): per-expert MoE tensors are fused (``experts.0.gate_proj.weight`` … into ``experts.gate_up_proj``),
Qwen4-Exp's embedding shards are concatenated (``ngram_embedding.shard_0.weight`` … into
``ngram_embedding.weight``), prefixes are renamed. :func:`loaded_names` asks transformers' own renaming for
each saved name, so a tensor a conversion produces is neither "missing" nor "unexpected" here, and its parts'
elements must add up to it (a lost shard or expert is a size the loader refuses); transformers 4.57 converts
nothing, and its names stay as saved.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from vlmfast.checkpoints.weight_files import canonical


@dataclass(frozen=True)
class Expected:
    """The tensors a model class expects for a config: canonical name → (the class's name, shape)."""

    tensors: dict[str, tuple[str, tuple[int, ...]]]
    tied_head: bool
    head: str | None  # canonical name of the output embedding's weight
    ignore_missing: tuple[str, ...] = ()  # the class's own patterns of tensors it does not need saved
    ignore_unexpected: tuple[str, ...] = ()  # ... and of saved tensors it drops on load (Qwen3.5's mtp.*)
    # saved name → (the name the loader gives it, whether a conversion made it: its shape is not the saved one);
    # only the saved names the loader renames
    loaded: dict[str, tuple[str, bool]] = field(default_factory=dict)


def expected_tensors(d: Path, config: dict, *, apart: bool = False, saved=()) -> Expected | None:
    """What the checkpoint's model class expects, built on the meta device from ``d``'s config.json (no
    memory; 0.4 s for the 3B shapes once torch and transformers are imported, which takes seconds), and
    kept in vlmfast's cache by the config's bytes, the class, the transformers version and the ``saved``
    tensor names (whose loaded names it gives): the checkpoints of one run share a config and their names, and
    a cached answer imports neither. ``apart``: build in a child process (``infer`` and ``sweep``: importing
    the model classes settles torch's compile cache directory, which they point at their own only later, before
    the model loads). None when the installed transformers has no class for it (said elsewhere)."""
    from vlmfast.checkpoints.families import family_of

    family = family_of(config)
    names = [family.model_class] if family else [a for a in config.get("architectures") or [] if isinstance(a, str)]
    if not names:
        return None
    saved = sorted(saved)
    cached = _cache_file(Path(d), names, saved)
    if cached is not None and cached.is_file():
        try:
            return _from_json(json.loads(cached.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # rebuilt below
    found = _build_elsewhere(Path(d), names, saved) if apart else _build_expected(Path(d), names, saved)
    if found is not None and cached is not None:
        from vlmfast.files import atomic_write

        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(cached, json.dumps(_to_json(found)).encode("utf-8"))
        except OSError:
            pass  # a read-only cache costs the build next time, nothing else
    return found


def _cache_file(d: Path, names: list[str], saved: list[str]) -> Path | None:
    from importlib.metadata import PackageNotFoundError, version

    from vlmfast.files import cache_root

    try:
        key = hashlib.sha256((d / "config.json").read_bytes() + "\0".join([*names, version("transformers")]).encode())
    except (OSError, PackageNotFoundError):
        return None
    key.update("\0".join(["saved", *saved]).encode())
    return cache_root() / "expected-tensors" / f"{key.hexdigest()[:24]}.json"


def _to_json(e: Expected) -> dict:
    return {"tensors": {c: [n, list(s)] for c, (n, s) in e.tensors.items()}, "tied_head": e.tied_head, "head": e.head,
            "ignore_missing": list(e.ignore_missing), "ignore_unexpected": list(e.ignore_unexpected),
            "loaded": {n: [to, converted] for n, (to, converted) in e.loaded.items()}}


def _from_json(data: dict) -> Expected:
    return Expected({c: (n, tuple(s)) for c, (n, s) in data["tensors"].items()}, bool(data["tied_head"]), data["head"],
                    tuple(data["ignore_missing"]), tuple(data["ignore_unexpected"]),
                    {n: (to, bool(converted)) for n, (to, converted) in data["loaded"].items()})


def _build_elsewhere(d: Path, names: list[str], saved: list[str]) -> Expected | None:
    """:func:`_build_expected` in a child Python (this module run as a script: the saved names on its
    standard input), its answer as JSON."""
    import os
    import subprocess
    import sys

    import vlmfast

    root = str(Path(vlmfast.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run([sys.executable, "-m", "vlmfast.checkpoints.expected", str(d), *names], capture_output=True,
                              text=True, env=env, timeout=600, input=json.dumps(saved))
        data = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return _from_json(data) if data else None


def _build_expected(d: Path, names: list[str], saved: list[str] = ()) -> Expected | None:
    import torch
    import transformers
    from transformers import AutoConfig

    cls = next((getattr(transformers, n, None) for n in names if getattr(transformers, n, None) is not None), None)
    if cls is None:
        return None
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # config warnings about unused keys are not this check's to show
    try:
        cfg = AutoConfig.from_pretrained(str(d))
        with torch.device("meta"):
            model = cls(cfg)
    except Exception:  # noqa: BLE001 - a config the class cannot build from is reported by the loader, not here
        return None
    finally:
        hf_logging.set_verbosity(level)
    tensors = {canonical(n): (n, tuple(t.shape)) for n, t in model.state_dict().items()}
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    head = None
    if out_emb is not None:
        head = next((canonical(n) for n, p in model.named_parameters(remove_duplicate=False) if p is out_emb.weight
                     and n.endswith("lm_head.weight")), None) or "lm_head.weight"
    tied = out_emb is not None and in_emb is not None and out_emb.weight is in_emb.weight
    return Expected(tensors, tied, head, tuple(_patterns(cls, "_keys_to_ignore_on_load_missing")),
                    tuple(_patterns(cls, "_keys_to_ignore_on_load_unexpected")), loaded_names(model, saved))


def loaded_names(model, saved) -> dict[str, tuple[str, bool]]:
    """The saved names the loader renames, each with its new name and whether a conversion (not a mere
    renaming) made it — as ``from_pretrained`` computes them (transformers 5: ``rename_source_key`` with the
    model's conversion mapping, its base-model prefix and its state dict); empty on transformers 4.57."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:
        return {}
    mapping = get_model_conversion_mapping(model)
    renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
    converters = [t for t in mapping if isinstance(t, WeightConverter)]
    state, prefix = model.state_dict(), model.base_model_prefix
    loaded = {}
    for name in saved:
        renamed, pattern = rename_source_key(name, renamings, converters, prefix, state)
        if renamed not in state and name in state:  # as the loader: a key it should not have renamed
            renamed, pattern = rename_source_key(name, [], [], base_model_prefix=prefix, meta_state_dict=state)
        if renamed != name:
            loaded[name] = (renamed, pattern is not None)
    return loaded


def _patterns(cls, attr: str) -> list[str]:
    value = getattr(cls, attr, None) or []
    return [p for p in value if isinstance(p, str)]


if __name__ == "__main__":  # the child process of _build_elsewhere: DIR CLASS..., the saved names on stdin → JSON
    import sys

    built = _build_expected(Path(sys.argv[1]), sys.argv[2:], json.loads(sys.stdin.read() or "[]"))
    print(json.dumps(_to_json(built) if built is not None else None))
