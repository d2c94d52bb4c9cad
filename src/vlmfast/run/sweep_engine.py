"""The models a sweep runs: its one engine (:class:`SweepEngine`), opened on the first checkpoint that has work
and switched to each next one (weights swapped in place when the shapes allow, else loaded afresh); what is odd
about ``--base``, and the LoRA adapters it carries (:func:`on_adapters_base`); and under ``--watch``, the
evaluated checkpoints rewritten in place since (:func:`rewritten`)."""

from __future__ import annotations

import time
from pathlib import Path

from vlmfast.errors import CheckpointError
from vlmfast.run.sweep_options import SweepOptions


class SweepEngine:
    """The sweep's one engine: opened on the first checkpoint that has work, then switched to each next
    one — only when that checkpoint's run first needs it (a finished one is read back, nothing loaded)."""

    def __init__(self, options: SweepOptions, say):
        self.options, self.say = options, say
        self.backend = self.current = None
        self.how: tuple[str, float] | None = None  # ("load" | "swap", seconds) of the last switch

    def at(self, found) -> _SwitchOnUse:
        return _SwitchOnUse(self, found)

    def switch(self, found) -> None:
        from vlmfast.engines.open import open_backend
        from vlmfast.run.parallel import Distributed

        if self.current is found:
            return
        why = None
        try:
            if self.backend is not None and for_checkpoint(self.options.infer, found).base is not None:
                self.close()  # adapters on the sweep's --base: the engine was opened without it (a full model first)
                self.backend, why = None, "its LoRA adapter loads with the sweep's --base"
            if self.backend is not None:
                how, seconds, why = self.backend.switch_to(found, canary=self.options.canary)
                if how is None:  # this engine cannot move to another checkpoint: a new one for it
                    self.backend.close()
                    self.backend = None
            if self.backend is None:
                start = time.perf_counter()
                self.backend = open_backend(for_checkpoint(self.options.infer, found), found, None, Distributed())
                how, seconds = "load", time.perf_counter() - start
        except BaseException as exc:  # a checkpoint that does not load: the next one opens an engine afresh
            self.close()
            self.backend = self.current = None
            if isinstance(exc, FileNotFoundError):  # deleted while it was copied in (save_total_limit): not this sweep's bug
                raise CheckpointError(f"{found.path}: its files went away while it was being loaded ({exc})",
                                      hint="the trainer deleted or rewrote it (save_total_limit?) during the sweep") from exc
            raise
        self.how = (how, seconds)
        if why:
            self.say(f"{found.path}: loaded afresh ({why})")
        self.current = found

    def engine_news(self) -> tuple[dict, list[str]]:
        """What the engine checked on its own while the last checkpoint ran (vLLM's canary): figures, and news."""
        return self.backend.news() if self.backend is not None else ({}, [])

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


def for_checkpoint(infer, found):
    """``infer`` for one checkpoint of the sweep: the ``base`` :func:`~vlmfast.run.sweep_record.on_adapters_base` set
    (the sweep's ``--base``, carrying LoRA adapters whose own base is not here) kept for an adapter, dropped for a
    full model (step 0 itself, or full checkpoints)."""
    import dataclasses

    if infer.base is None or getattr(found, "kind", None) == "adapter":
        return infer
    return dataclasses.replace(infer, base=None)


class _SwitchOnUse:
    """A :class:`~vlmfast.engines.contract.Backend` for one checkpoint: the sweep's engine, switched to it on first use."""

    def __init__(self, models: SweepEngine, found):
        self._models, self._found = models, found

    def __getattr__(self, name):
        self._models.switch(self._found)
        return getattr(self._models.backend, name)

    def close(self) -> None:  # the engine outlives each checkpoint's run
        pass


def rewritten(checkpoints, figures: list[dict], options) -> list:
    """``--watch``: the evaluated checkpoints whose weight files were rewritten in place since (another
    fingerprint at the same path: a rerun of the training into the same output dir); evaluated again."""
    from vlmfast.checkpoints.fingerprint import weights_fingerprint
    from vlmfast.checkpoints.locate import locate
    from vlmfast.run.sweep_record import same_digest

    then = {(f["step"], f["path"]): f.get("fingerprint") for f in figures if f["label"] != "base"}
    out = []
    for c in checkpoints:
        if then.get((c.step, str(c.path))) is None:
            continue
        key = (str(c.path), then[(c.step, str(c.path))])
        if _LOOKED.get(key) == (sign := files_signature(c.path)):
            continue  # no file of it written since the last look: not digested again (--fingerprint full reads every byte)
        _LOOKED[key] = sign
        try:
            now = weights_fingerprint(locate(c.path), options.infer.fingerprint, options.infer.base)
        except CheckpointError:
            continue
        if now is not None and not same_digest(then[(c.step, str(c.path))], now):
            out.append(c)
    return out


_LOOKED: dict[tuple[str, str], tuple] = {}  # (checkpoint dir, fingerprint it was evaluated with) → its files' signature


def files_signature(path) -> tuple:
    """Names, sizes and modification times of the files in ``path``: what a rewrite in place changes."""
    try:
        return tuple(sorted((p.name, st.st_size, st.st_mtime_ns) for p in Path(path).iterdir()
                            if p.is_file() and (st := p.stat())))
    except OSError:
        return ()


def on_adapters_base(options, entries: list):
    """(options, notes): what is odd about ``--base`` (:func:`base_notes`); and LoRA adapters whose named base
    (adapter_config.json's ``base_model_name_or_path``: the training machine's path, or a hub id) is no directory
    here run on the sweep's ``--base``, said once, and are fingerprinted with it. Before, every such step was "not
    evaluated: its base does not exist here" with the hint to pass ``--base``, which the sweep had been given."""
    import dataclasses

    from vlmfast.checkpoints.readers import adapter_base_or_none, is_adapter_dir

    base = next((e for e in entries if e.label == "base"), None)
    named = {adapter_base_or_none(e.path) for e in entries if e.label != "base" and is_adapter_dir(e.path)} - {None}
    away = sorted(n for n in named if not Path(n).expanduser().is_dir())
    if base is None or not away or not Path(str(base.path)).is_dir():
        return options, base_notes(entries)
    return (dataclasses.replace(options, infer=dataclasses.replace(options.infer, base=str(base.path))),
            [f"the run's LoRA adapters name {', '.join(away)} as their base (adapter_config.json), which is not a "
             f"directory here: they run on --base {base.path}"] + base_notes(entries))


def base_notes(entries: list) -> list[str]:
    """What is odd about ``--base``: another model family than the run's checkpoints, one of the run's own
    checkpoints, or a directory a trainer saved (its trainer_state.json)."""
    from vlmfast.checkpoints.readers import maybe_json

    base = next((e for e in entries if e.label == "base"), None)
    trained = [e for e in entries if e.label != "base"]
    if base is None or not trained:
        return []
    notes = []
    from vlmfast.checkpoints.readers import adapter_base_or_none, is_adapter_dir

    first = trained[0].path
    # a LoRA adapter has no config.json of its own: it is the model its base is (the one it runs on)
    under = adapter_base_or_none(first) if is_adapter_dir(first) else None
    config_of = {base.path: Path(base.path), first: Path(under) if under else Path(first)}
    kinds = {p: maybe_json(d / "config.json").get("model_type") for p, d in config_of.items()}
    if under is not None and Path(under).expanduser().is_dir() and Path(base.path).is_dir() \
            and Path(under).expanduser().resolve() != Path(base.path).resolve():
        notes.append(f"--base {base.path} is not the base the run's LoRA adapters run on ({under}, from "
                     f"{Path(first).name}/adapter_config.json): step 0 is another model than the one the adapters change")
    if None not in kinds.values() and kinds[base.path] != kinds[first]:
        notes.append(f"--base {base.path} is a {kinds[base.path]} model and the run's checkpoints are "
                     f"{kinds[first]}: the comparison is between two families, not before and after RL")
    if any(Path(e.path).resolve() == Path(base.path).resolve() for e in trained):
        notes.append(f"--base {base.path} is one of the run's own checkpoints, not the model it started from")
    elif (Path(base.path) / "trainer_state.json").is_file():
        notes.append(f"--base {base.path} holds a trainer_state.json: a training checkpoint, not the model the run "
                     "started from (give the original model, e.g. its hub id)")
    return notes
