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
the first request that differs, and the fresh engine carries on with the checkpoint. Every reload, the
first and the later ones, is also read back: a few language-model norm weights (kept unfused and whole on
every rank) are hashed in the workers and compared with the checkpoint's files, so a reload that left
other weights is caught at the step it happened; a fresh engine then takes over, as after a failed canary.
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
    started_s: float = 0.0  # vLLM start-ups of this backend's engine (the canary's excluded) not yet reported
    notes: list[str] = field(default_factory=list)

    def described(self) -> dict:
        return {"reload_s": _rounded(self.reload_s), "canary_s": _rounded(self.canary_s)}

    def news(self) -> tuple[dict, list[str]]:
        """The canary's verdict after the first in-place reload: its seconds for the figures, and what it
        found, said once (:meth:`vlmfast.engines.contract.Backend.news`); and ``engine_start_s``, the seconds vLLM's
        engine took to start since last asked (a checkpoint's ``load_s`` ends before it: vLLM starts on first use)."""
        started = {"engine_start_s": _rounded(self.started_s)} if self.started_s else {}
        self.started_s = 0.0
        if not self.notes:
            return started, []
        notes = list(self.notes)
        self.notes.clear()
        return {**started, **({"canary_s": _rounded(self.canary_s)} if self.canary_s is not None else {})}, notes


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
    except BaseException:  # this checkpoint refused (its files): the old overlays close with the engine, not leak
        backend._stacks[:0] = old
        raise
    for stack in old:
        stack.close()
    wrong = reloaded_mismatch(backend.llm, Path(found.path))
    if wrong is not None:  # the engine kept other weights: a fresh engine takes this checkpoint and the later ones
        backend.reload.enabled = False
        note = (f"read-back after the in-place reload of {found.path}: {wrong}; this checkpoint gets a fresh vLLM "
                "engine, and so does every later one")
        backend.reload.notes.append(note)
        return note
    return None


READBACK_TENSORS = 3  # language-model norm weights compared after every reload


def readback_picks(directory: Path) -> dict[str, tuple[str, str]]:
    """Which saved tensors to read back after a reload: language-model norm weights (first, middle and last
    by name), the tensors vLLM keeps as saved — unfused, and whole on every tensor-parallel rank. Their
    name with the wrappers taken off → (file, saved name)."""
    from vlmfast.checkpoints.fingerprint import weight_files
    from vlmfast.checkpoints.readers import safetensors_header

    found = {}
    for path in weight_files(directory):
        if path.suffix != ".safetensors":
            continue
        for name in safetensors_header(path):
            if name.endswith("norm.weight") and "visual" not in name and not name.startswith("mtp"):
                found[_tail(name)] = (path.name, name)
    ordered = sorted(found)
    if len(ordered) > READBACK_TENSORS:
        ordered = [ordered[0], ordered[len(ordered) // 2], ordered[-1]]
    return {t: found[t] for t in ordered}


def _tail(name: str) -> str:
    """A parameter's name without the wrappers saves and engines put around it (``model.``,
    ``language_model.``, in any order)."""
    changed = True
    while changed:
        changed = False
        for prefix in ("model.", "language_model."):
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    return name


def worker_digests(worker, tails: list[str]) -> dict[str, tuple[str, str]]:
    """Run in every vLLM worker: the dtype and SHA-256 of the bytes of each parameter whose name, wrappers
    off, is in ``tails``."""
    import hashlib

    import torch

    runner = worker.model_runner
    model = getattr(runner, "model", None) or runner.get_model()
    wanted, out = set(tails), {}
    for name, param in model.named_parameters():
        tail = _tail(name)
        if tail in wanted:
            data = param.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
            out[tail] = (str(param.dtype), hashlib.sha256(data.numpy().tobytes()).hexdigest())
    return out


def reloaded_mismatch(llm, directory: Path) -> str | None:
    """After a reload: the first read-back tensor (:func:`readback_picks`) whose bytes in the engine differ
    from the checkpoint's own (cast to the engine's dtype), or None when they agree — or when the engine
    cannot say (no such tensors, an RPC this vLLM lacks: the canary stays the check)."""
    import hashlib

    import torch
    from safetensors import safe_open

    picks = readback_picks(directory)
    if not picks:
        return None
    try:
        answers = llm.collective_rpc(worker_digests, args=(list(picks),))
    except Exception:  # noqa: BLE001 - an engine that cannot answer is not evidence of stale weights
        return None
    held = {}
    for answer in answers or []:
        held.update(answer or {})
    for tail, (file, name) in picks.items():
        if tail not in held:
            continue
        dtype, digest = held[tail]
        with safe_open(str(directory / file), framework="pt", device="cpu") as f:
            saved = f.get_tensor(name)
        saved = saved.to(getattr(torch, dtype.removeprefix("torch."))).contiguous()
        if hashlib.sha256(saved.view(-1).view(torch.uint8).numpy().tobytes()).hexdigest() != digest:
            return f"{name} holds other values in the engine than {directory.name}/{file} saves"
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
    decoded greedily on the reloaded engine and on a fresh engine of the same checkpoint. The reloaded engine
    stops before the fresh one starts (a GPU holds one engine's memory share at a time), and the fresh engine
    takes over. Different tokens: in-place reloads stop for the rest of the sweep."""
    from vlmfast.engines.vllm.support import shutdown

    state = backend.reload
    state.canary_due, state.checked = False, True
    picks = sorted(requests, key=lambda r: r.id)[:state.canary_requests]
    start = time.perf_counter()
    greedy = dataclasses.replace(backend.settings, temperature=0.0, n=1, seed=None,
                                 max_new_tokens=min(backend.settings.max_new_tokens, CANARY_NEW_TOKENS))
    reloaded = _decode(backend, picks, greedy)
    shutdown(backend.llm)
    backend.llm = None  # should the fresh engine fail to start, the next run starts one for this checkpoint
    # started for the run's own settings, not the canary's: it carries on with the sweep's rows, and its engine
    # arguments depend on them (sampling on a CPU takes whole prefills, see VllmBackend.engine_args)
    fresh = type(backend)(backend.found, dataclasses.replace(backend.settings, seed=backend.seed), **backend.rebuild_kwargs())
    try:
        fresh.start(requests)
        differs = first_differing_id(reloaded, _decode(fresh, picks, greedy))
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
