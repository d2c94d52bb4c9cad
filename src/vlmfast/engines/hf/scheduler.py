"""Which requests run together and in what order: every request through the decode rows continuously
(:mod:`vlmfast.engines.hf.continuous`, most expensive first), or cost-sorted batches (most expensive
first, so an out-of-memory batch shows up at once) with the next batch prepared while this one
generates; CUDA out-of-memory halving either way. Nothing here touches the model."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from vlmfast.engines.batching import plan_batches
from vlmfast.engines.hf.engine import Engine, Prefetched
from vlmfast.inputs.requests import Request
from vlmfast.engines.contract import Batch
from vlmfast.engines.rows import error_row
from vlmfast.timing import is_out_of_memory


def plan(engine: Engine, requests: Sequence[Request], image_sizes: dict, batch_size: int,
         max_batch_tokens: int | None = None) -> list[list[int]]:
    """Indices of ``requests`` grouped into batches by prefill cost (see :func:`vlmfast.engines.batching.plan_batches`)."""
    return plan_batches([engine.cost(r, image_sizes) for r in requests], batch_size, max_batch_tokens)


class Scheduler:
    """Runs a workload batch by batch through an :class:`~vlmfast.engines.hf.engine.Engine`.

    ``overlap`` (default: on CUDA) lets a worker thread prepare batch k+1 — images decoded and resized,
    and on a GPU the processor's tensors too — while batch k generates; each batch's timing says how
    much preprocessing the model still waited for. On a CPU the worker competes with decode for the
    same cores (measured: no faster with images only, decode 2.6× slower with tensors too)."""

    def __init__(self, engine: Engine, *, overlap: bool | None = None):
        self.engine = engine
        self.overlap = engine.on_cuda if overlap is None else overlap
        self.oom_splits = 0  # batches halved after a CUDA out-of-memory error

    def run(self, requests: Sequence[Request], image_sizes: dict, batch_size: int,
            max_batch_tokens: int | None = None) -> Iterator[Batch]:
        """Yield (input indices, results, timing) batch by batch, most expensive first; ``timing`` is
        None for a batch that produced only error rows."""
        for parts in self.batches(requests, image_sizes, plan(self.engine, requests, image_sizes, batch_size, max_batch_tokens)):
            yield from parts

    def batches(self, requests: Sequence[Request], image_sizes: dict, planned: list[list[int]]) -> Iterator[list[Batch]]:
        """For each planned batch (indices into ``requests``), what it produced: one (indices, results,
        timing) item, or several when out-of-memory halving split it."""
        import torch

        if self.engine.settings.seed is not None:
            torch.manual_seed(self.engine.settings.seed)
        if not self.overlap:
            for indices in planned:
                yield list(self._resilient(requests, indices))
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlmfast-prefetch") as pool:
            pending = pool.submit(self._prefetch, [requests[i] for i in planned[0]]) if planned else None
            for k, indices in enumerate(planned):
                waited = time.perf_counter()
                ready = pending.result()
                ready.waited_s = time.perf_counter() - waited
                if k + 1 < len(planned):
                    pending = pool.submit(self._prefetch, [requests[i] for i in planned[k + 1]])
                yield list(self._resilient(requests, indices, ready))

    def continuous(self, requests: Sequence[Request], image_sizes: dict, order: list[int], width: int,
                   policy=None) -> Iterator[Batch]:
        """The requests at ``order`` (indices, most expensive first) through ``width`` decode rows, each
        answer yielded as it ends: (input indices, rows, None), with the admissions' and the decode loop's
        timings as items of their own. After a CUDA out-of-memory error the answers not yet given run in
        halved static batches (an answer already given is not given again). ``policy``: when to admit (an
        :class:`~vlmfast.engines.hf.continuous.AdmitPolicy`; the device's own by default)."""
        import torch

        from vlmfast.engines.hf.capacity import PROMPT_SLACK_TOKENS
        from vlmfast.engines.hf.continuous import stream

        engine = self.engine
        if engine.settings.seed is not None:
            torch.manual_seed(engine.settings.seed)
        todo = [requests[i] for i in order]
        index = {r.id: i for i, r in zip(order, todo)}
        length = max(engine.cost(r, image_sizes) for r in todo) + PROMPT_SLACK_TOKENS + engine.settings.max_new_tokens
        given: set[tuple[str, int | None]] = set()
        failed, cut = None, []
        try:
            for rows, timing in stream(engine, todo, width, length, policy, overlap=self.overlap, cut=cut):
                given.update((r.id, r.sample) for r in rows)
                if rows or timing is not None:
                    yield [index[r.id] for r in rows], rows, timing
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            failed = str(exc)
        if failed is None:
            return
        if cut:  # the steps that decoded the answers already given: the report's decode figures count them
            yield [], [], cut[0]
        engine.forget_shapes()  # as in _resilient: the failed attempt's tensors and shapes go before anything retries
        self.oom_splits += 1
        n = engine.settings.n
        rest = [i for i in order if any((requests[i].id, k if n > 1 else None) not in given for k in range(n))]
        per_batch = max(1, width // n // 2)
        for start in range(0, len(rest), per_batch):
            for indices, rows, timing in self._resilient(requests, rest[start:start + per_batch]):
                yield indices, [r for r in rows if (r.id, r.sample) not in given], timing

    def _prefetch(self, batch) -> Prefetched:
        """The worker's job: decode images and, on a GPU, prepare the whole batch as pinned CPU tensors (on
        a GPU the main thread only waits; on a CPU they would fight decode for cores). Nothing here
        touches the GPU: the main thread may be capturing a CUDA graph meanwhile."""
        start = time.perf_counter()
        images, failed = self.engine.load_images(batch)
        ready = Prefetched(images, failed, 0.0)
        if self.engine.on_cuda:
            ready.prepared = self.engine.prepare(batch, ready)
        ready.worker_s = time.perf_counter() - start
        return ready

    def _resilient(self, requests: Sequence[Request], indices: list[int], prefetched: Prefetched | None = None
                   ) -> Iterator[Batch]:
        """A CUDA out-of-memory error halves the batch and retries both halves; a sample that does not
        fit even alone becomes an error row. Nothing is dropped, and the count lands in the report.

        The retry happens after the ``except`` block, holding only the error's message: the exception's
        traceback keeps the failed attempt's frames, and with them its prefill caches, static KV cache and
        vision activations, which would otherwise stay allocated while both halves run."""
        failed = None
        try:
            results, timing = self.engine.generate_batch([requests[i] for i in indices], prefetched)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            failed = str(exc)
        if failed is None:
            yield indices, results, timing
            return
        # the failed attempt's tensors are unreferenced now: their memory goes back, and so do the built decode
        # shapes, its own among them (a shape is evicted only when another is stored, which a half that runs
        # out of memory building its own never does: the failed one would stay for the whole run)
        self.engine.forget_shapes()
        if len(indices) == 1:
            r = requests[indices[0]]
            yield indices, [error_row(r.id, r, f"out of memory even alone ({failed})")], None
            return
        self.oom_splits += 1
        half = len(indices) // 2
        for part in (indices[:half], indices[half:]):
            yield from self._resilient(requests, part, _subset(prefetched, [requests[i].id for i in part]))


def _subset(prefetched: Prefetched | None, ids: list[str]) -> Prefetched | None:
    """The prefetched images of some of a batch's requests (after an out-of-memory split); the batch's
    prepared tensors do not fit a half, so they are rebuilt from the decoded images."""
    if prefetched is None:
        return None
    return Prefetched({i: prefetched.images[i] for i in ids if i in prefetched.images},
                      {i: prefetched.failed[i] for i in ids if i in prefetched.failed}, 0.0)
