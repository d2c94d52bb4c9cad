"""The sweep's one engine (:class:`SweepEngine`): opened on the first checkpoint that has work, then switched to
each next one — its weights swapped in place when the shapes allow, else loaded afresh — and what ``--watch`` checks
of the checkpoints it evaluated (:func:`rewritten`)."""

from __future__ import annotations

import time

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
                self.backend = None
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
        if _LOOKED.get(key) == (sign := _files_signature(c.path)):
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


def _files_signature(path) -> tuple:
    """Names, sizes and modification times of the files in ``path``: what a rewrite in place changes."""
    from pathlib import Path

    try:
        return tuple(sorted((p.name, st.st_size, st.st_mtime_ns) for p in Path(path).iterdir()
                            if p.is_file() and (st := p.stat())))
    except OSError:
        return ()
