"""The next checkpoint of a sweep in the running vLLM engine: its weights reloaded in place, checked once.

A fresh vLLM engine per checkpoint costs its start-up each time (weight loading, profiling, graph
capture: tens of seconds on a CPU, minutes on GPUs). Checkpoints of one run share every shape, so their
weights can be loaded into the running engine instead, through vLLM's own
``collective_rpc("reload_weights", weights_path=…, is_checkpoint_format=True)`` (the worker resets its
encoder and multimodal caches; the prefix cache is reset here). That is easy to get silently wrong —
stale weights after a reload, stale image-encoder caches, hybrid linear-attention models corrupted by
layer-wise reloading have all been reported against vLLM — so the first reload of a sweep is checked:
a fixed set of requests (the ``canary``) is decoded greedily on the reloaded engine and on a fresh engine
of the same checkpoint. Any difference turns in-place reloading off for the rest of the sweep, names
the first request that differs, and the fresh engine carries on with the checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

RELOAD_RPC = "reload_weights"
CANARY_REQUESTS = 8  # a sweep's default --canary
CANARY_NEW_TOKENS = 32  # enough tokens for wrong weights to show, few enough to keep the check short


@dataclass
class ReloadState:
    """What a backend knows about reloading in place across a sweep."""

    enabled: bool = True  # off after a failed canary or on a vLLM without the reload RPC
    canary_requests: int = CANARY_REQUESTS  # 0: no check
    canary_due: bool = False  # the next batches() call runs the canary first
    checked: bool = False  # a canary has run in this sweep
    reload_s: float | None = None  # the last reload's seconds
    canary_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def described(self) -> dict:
        return {"reload_s": _rounded(self.reload_s), "canary_s": _rounded(self.canary_s)}

    def news(self) -> tuple[dict, list[str]]:
        """The canary's verdict after the first in-place reload: its seconds for the figures, and what it
        found, said once (:meth:`vlmfast.engines.contract.Backend.news`)."""
        if not self.notes:
            return {}, []
        notes = list(self.notes)
        self.notes.clear()
        return ({"canary_s": _rounded(self.canary_s)} if self.canary_s is not None else {}), notes


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def reload_blocker(current, found) -> str | None:
    """Why ``found`` cannot be reloaded into an engine running ``current`` (both located checkpoints), or
    None when it can: a local full safetensors checkpoint with the same config and tensor shapes, of a
    family without linear-attention layers."""
    from vlmfast.checkpoints.families import family_of
    from vlmfast.checkpoints.readers import read_configs
    from vlmfast.checkpoints.swap import layout_difference

    if not found.is_local or found.kind != "model" or not current.is_local or current.kind != "model":
        return "in-place reload takes local full checkpoints (not a hub id or a LoRA adapter)"
    config, _ = read_configs(found.path)
    family = family_of(config)
    if family is not None and family.linear_attention:
        return f"{family.key} has linear-attention layers, which vLLM's layer-wise reload is known to corrupt"
    return layout_difference(Path(current.path), Path(found.path))


def switch(backend, found) -> tuple[str, float, str | None]:
    """Point ``backend`` at the next checkpoint ``found``: ("reload", seconds, None) when its weights went
    into the running engine; ("load", seconds, why) when the backend was rebuilt for it (vLLM then starts
    afresh on first use)."""
    state = backend.reload
    why = "vLLM has not started yet" if backend.llm is None else reload_blocker(backend.found, found)
    if why is None and not state.enabled:
        why = "in-place reload is off for this sweep (see the note above)"
    start = time.perf_counter()
    if why is None:
        why = _reload(backend, found)
        if why is None:
            state.reload_s = time.perf_counter() - start
            state.canary_due = state.canary_requests > 0 and not state.checked
            return "reload", state.reload_s, None
    backend.close()
    backend._build(found)
    return "load", time.perf_counter() - start, why


def _reload(backend, found) -> str | None:
    """Reload ``found``'s weights into the running engine and read its processor, EOS list and settings;
    None when done, else why it could not be (in-place reload is then off for the sweep)."""
    old = list(backend._stacks)
    backend._stacks.clear()
    try:
        backend._build(found)  # its overlay, processor and EOS list
        reload_weights(backend.llm, backend.model_dir)
    except ReloadUnsupported as exc:
        backend._stacks[:0] = old  # the engine still runs the old weights: keep their overlay
        backend.reload.enabled = False
        note = f"in-place reload is not available here ({exc}): a fresh vLLM engine per checkpoint"
        backend.reload.notes.append(note)
        return note
    for stack in old:
        stack.close()
    return None


class ReloadUnsupported(Exception):
    """The installed vLLM's workers have no in-place reload."""


def reload_weights(llm, weights_dir) -> None:
    """vLLM's own in-place reload of the checkpoint in ``weights_dir``, then every cache that holds what
    the old weights computed: the prefix cache (KV blocks), the multimodal processor cache, and the
    encoder cache on both sides — the worker empties its own on reload, but the scheduler's bookkeeping
    would still count the old image embeddings as cached (a miss then kills the engine)."""
    try:
        llm.collective_rpc(RELOAD_RPC, kwargs={"weights_path": str(weights_dir), "is_checkpoint_format": True})
    except (AttributeError, NotImplementedError) as exc:
        raise ReloadUnsupported(f"{type(exc).__name__}: {exc}") from exc
    engine = getattr(llm, "llm_engine", None)
    for owner, reset in ((llm, "reset_prefix_cache"), (llm, "reset_mm_cache"), (engine, "reset_encoder_cache")):
        method = getattr(owner, reset, None)
        if method is None:
            raise ReloadUnsupported(f"this vLLM has no {reset}(): stale cached results could survive a reload")
        method()


def run_canary(backend, requests) -> None:
    """The first reload's check: the canary requests (the first N ids of the workload, in id order)
    decoded greedily on the reloaded engine and on a fresh engine of the same checkpoint. Equal: the fresh
    engine goes. Different: in-place reloads stop for the sweep, and the fresh engine takes over."""
    state = backend.reload
    state.canary_due, state.checked = False, True
    picks = sorted(requests, key=lambda r: r.id)[:state.canary_requests]
    start = time.perf_counter()
    greedy = dataclasses.replace(backend.settings, temperature=0.0, n=1, seed=None,
                                 max_new_tokens=min(backend.settings.max_new_tokens, CANARY_NEW_TOKENS))
    reloaded = _decode(backend, picks, greedy)
    fresh = type(backend)(backend.found, greedy, **backend.rebuild_kwargs())
    try:
        fresh.start(requests)
        differs = first_differing_id(reloaded, _decode(fresh, picks, greedy))
        if differs is not None:
            _take_over(backend, fresh)
    finally:
        fresh.close()
    state.canary_s = time.perf_counter() - start
    if differs is None:
        state.notes.append(f"canary: {len(picks)} request(s) decoded the same on the reloaded engine as on a fresh "
                           f"one ({state.canary_s:.1f} s); later checkpoints are reloaded in place")
    else:
        state.enabled = False
        state.notes.append(f"canary: request {differs!r} decoded differently on the reloaded engine than on a fresh "
                           "one: this checkpoint runs on the fresh engine, and every later checkpoint gets a fresh "
                           "engine too")


def _decode(backend, picks, greedy) -> list:
    keep = backend.settings, backend.sampling_params
    backend.settings = greedy
    backend.sampling_params = backend._sampling_params()
    try:
        return backend.generate_batch(picks)[0]
    finally:
        backend.settings, backend.sampling_params = keep


def first_differing_id(a: list, b: list) -> str | None:
    """The first request id (in ``a``'s order) whose rows' tokens differ between ``a`` and ``b``."""
    theirs = {(r.id, r.sample): (r.token_ids, r.error) for r in b}
    for row in a:
        if theirs.get((row.id, row.sample)) != (row.token_ids, row.error):
            return row.id
    return None


def _take_over(backend, fresh) -> None:
    """``backend`` continues on ``fresh``'s engine and overlay (the reloaded engine is stopped)."""
    from vlmfast.engines.vllm.support import close_stacks, shutdown

    shutdown(backend.llm)
    close_stacks(backend._stacks)
    backend.llm, fresh.llm = fresh.llm, None
    backend._stacks.extend(fresh._stacks)
    fresh._stacks.clear()
    backend.model_dir, backend.startup_s = fresh.model_dir, fresh.startup_s
