"""Continuous batching: a row whose answer ended takes the next waiting request while the others go on.

A static batch runs until its longest answer ends: GRPO answers spread 10× in length, so most of a
batch's rows spend most of its steps computing padding. Here the decode state keeps ``width`` rows busy:

- **admit**: when the policy says so, the next requests (most expensive first, as planned) are prepared
  and prefilled (in groups within the prefill token budget), their caches copied into free rows
  (:meth:`~vlmfast.engines.hf.decode.DecodeState.admit`); n answers of a request share one prefill;
- **step**: one token for every row (the static shapes of CUDA graphs and compiled steps never change:
  admission happens between steps, outside them);
- **harvest**: every ``sync_every`` steps, rows whose answer ended hand it back and are free again; each
  answer becomes a result row at once (the runner writes it, flushed, before the next step).

Every row is independent (its own length, positions, count and sampling key, which draws by (seed, id,
sample, step)), so an answer's tokens do not depend on when it was admitted or who shares the batch.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from vlmfast.engines.rows import BatchTiming, SampleResult, error_row
from vlmfast.inputs.requests import Request
from vlmfast.timing import StepTimes, now

DECIDE_AFTER = 32  # decode steps measured before a run whose compile policy is undecided weighs compiling


@dataclass(frozen=True)
class AdmitPolicy:
    """When free rows take waiting requests, and how many are prefilled at once. An admission stalls every
    live row for the newcomers' prefill, and on a GPU a prefill of one request costs nearly what one of
    eight does (H200, 3B shape: 82 ms and 122 ms), while a step costs about the same for 8 rows or 32. So
    on a GPU a free row takes an answer from a reserve prefilled ahead (a copy, no prefill), and when the
    reserve is empty the next prefill makes answers for ``ahead`` of the rows at once: rows stay busy and
    prefills stay few. A CPU computes only live rows and prefills in proportion to the tokens: a free row
    takes the next request as soon as it frees. Either way a request's n answers need not find n free rows
    at once: those that find none wait, prefilled, for the next rows to free (:class:`Parked`)."""

    min_free: float  # share of the rows that must be free (0: one row is enough)
    ahead: float  # share of the rows whose answers one admission prefills at least (0: only the free rows')
    name: str

    @classmethod
    def for_device(cls, on_cuda: bool) -> AdmitPolicy:
        if on_cuda:
            return cls(0.0, 1.0, "a free row takes an answer prefilled ahead; each prefill makes a full set of rows' answers")
        return cls(0.0, 0.0, "admit as soon as a row is free")

    def due(self, free: int, width: int, live: int, waiting: int) -> bool:
        if not waiting or not free:
            return False
        return live == 0 or free >= math.ceil(self.min_free * width)

    def requests(self, free: int, width: int, n: int, waiting: int) -> int:
        """How many waiting requests one admission prefills: answers for the free rows, or for ``ahead`` of
        all rows if that is more (the rest wait prefilled): at most a set of rows' answers (in whole
        requests), as a static batch's prefill, which is what the memory plan counts."""
        return min(waiting, math.ceil(max(free, math.ceil(self.ahead * width)) / n))


class Ahead:
    """The images of the requests next in line, decoded by a worker thread while the rows decode, so an
    admission finds them ready (on CUDA; on a CPU the worker would take the cores decode runs on). The
    worker never touches the GPU: the main thread may be capturing a CUDA graph meanwhile."""

    def __init__(self, engine, waiting: deque, depth: int):
        from concurrent.futures import ThreadPoolExecutor

        self.engine, self.waiting, self.depth = engine, waiting, depth
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlmfast-prefetch")
        self.pending: dict[str, object] = {}

    def refill(self) -> None:
        for r in list(self.waiting)[:self.depth]:
            if r.id not in self.pending:
                self.pending[r.id] = self.pool.submit(self._load, r)

    def _load(self, request: Request):
        start = time.perf_counter()
        images, failed = self.engine.load_images([request])
        return images, failed, time.perf_counter() - start

    def take(self, batch: list[Request]):
        """What the worker made of ``batch`` (waiting for what it has not finished), as a Prefetched."""
        from vlmfast.engines.hf.engine import Prefetched

        start = time.perf_counter()
        images, failed, worker_s = {}, {}, 0.0
        for r in batch:
            got = self.pending.pop(r.id).result() if r.id in self.pending else (*self.engine.load_images([r]), 0.0)
            images.update(got[0])
            failed.update(got[1])
            worker_s += got[2]
        return Prefetched(images, failed, worker_s, time.perf_counter() - start)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class Parked:
    """Answers of a prefilled group that found no free row yet: its cache waits for the next rows to free
    (a request's n answers share one prefill, and a row frees at a time), so no row waits for n to free."""

    group: object  # the Admission
    pick: list[int]  # its decode rows still without a row
    owners: list  # their (id, sample)

    def seat(self, state, free: list[int]) -> list[int]:
        """Admit as many as ``free`` rows take; returns the rows still free."""
        k = min(len(free), len(self.pick))
        if k:
            state.admit(self.group, free[:k], self.owners[:k], self.pick[:k])
            self.pick, self.owners = self.pick[k:], self.owners[k:]
        return free[k:]


@dataclass
class Held:
    """A request whose answers are being decoded: what its result rows need, and how many are still out."""

    request: Request
    prepared: object
    out: int


def stream(engine, requests: Sequence[Request], width: int, length: int, policy: AdmitPolicy | None = None,
           overlap: bool = False, cut: list | None = None) -> Iterator[tuple[list[SampleResult], BatchTiming | None]]:
    """Every answer of ``requests`` through ``width`` decode rows of a ``length``-position cache: yields
    (result rows, None) as answers end, (error rows, None) for requests whose images fail, a timing per
    admission (its preparation and prefill) and, last, the decode loop's timing (its steps, row-steps
    and device read-backs). ``length`` grows by itself when a prompt turns out longer than planned.
    ``overlap``: the images of the next requests are decoded by a worker meanwhile (:class:`Ahead`). ``cut``:
    where a run that fails (a CUDA out-of-memory error) leaves the decode loop's timing so far, for a caller
    that goes on without the loop: the answers it gave were decoded in those steps."""
    policy = policy or AdmitPolicy.for_device(engine.on_cuda)
    waiting = deque(requests)
    state = decode_state(engine, width, length)
    ahead = Ahead(engine, waiting, state.batch) if overlap else None
    try:
        if ahead is not None:
            ahead.refill()
        yield from _loop(engine, state, waiting, policy, ahead, cut)
    finally:
        if ahead is not None:
            ahead.close()


def _loop(engine, state, waiting: deque, policy: AdmitPolicy, ahead: Ahead | None, cut: list | None = None):
    import torch

    s, n = engine.settings, engine.settings.n
    held: dict[str, Held] = {}
    parked: deque[Parked] = deque()
    clock = StepTimes(engine.device) if engine.record_steps else None
    decode_s = admitted = first_tokens = syncs = answered = answer_tokens = seated_s = waited = 0
    t_last = None

    def loop_timing(decode_s: float) -> BatchTiming:
        marks = clock.times() if clock is not None else []
        return BatchTiming(size=0, preprocess_s=0.0, ttft_s=0.0, decode_s=decode_s, steps=state.t + 1, new_tokens=0,
                           step_times_s=tuple(b - a for a, b in zip(marks[::2], marks[1::2])), syncs=syncs,
                           row_steps=state.row_steps + first_tokens, first_rows=first_tokens,
                           cache_fill_s=seated_s)

    try:
        with torch.inference_mode():
            while waiting or parked or state.live():
                if state.t % engine.sync_every == 0 or not state.live():
                    syncs += 1
                    ended = state.harvest()  # (the read-back waits for the steps queued: decoding)
                    paused = now(engine.device)
                    rows = _finished(engine, ended, held)
                    answered, answer_tokens = answered + len(rows), answer_tokens + sum(r.n_new_tokens for r in rows)
                    yield rows, None  # the caller scores, writes and fsyncs them: not decoding
                    if t_last is not None:
                        t_last += now(engine.device) - paused
                    if engine.policy.undecided and state.t >= DECIDE_AFTER and t_last is not None:
                        mean = answer_tokens / answered if answered else s.max_new_tokens / 2
                        answers = len(waiting) * n + sum(len(p.pick) for p in parked) + state.live()
                        remaining = steps_to_go(state, answers, mean, s.max_new_tokens)
                        weighed = now(engine.device)
                        step_ms = (decode_s + weighed - t_last) * 1000 / state.t
                        if engine.decide_compile_now(step_ms, remaining):
                            decode_s += weighed - t_last  # the steps since the clock last started were decoding
                            state = decode_state(engine, state.batch, state.max_len, carry=state)
                            t_last = now(engine.device)  # the compile is not decoding
                    state.pack()
                    free = state.free_rows()
                    if parked and free:  # answers prefilled earlier first: their rows cost a copy, no prefill
                        t0 = now(engine.device)
                        free, seated = _seat(state, parked, free)
                        waited, seated_s = waited + seated, seated_s + now(engine.device) - t0
                        if t_last is not None:
                            t_last += now(engine.device) - t0  # (the copy is cache fill, not decoding)
                    if not parked and policy.due(len(free), state.batch, state.live(), len(waiting)):
                        if t_last is not None:
                            decode_s += now(engine.device) - t_last
                            t_last = None  # the clock stops for the admission (it starts again after it)
                        take = [waiting.popleft() for _ in range(policy.requests(len(free), state.batch, n, len(waiting)))]
                        errors, timing, state, answers = _admit(engine, state, take, held, parked,
                                                                ahead.take(take) if ahead else None)
                        if ahead is not None:
                            ahead.refill()
                        admitted, first_tokens = admitted + (timing.size if timing else 0), first_tokens + answers
                        yield errors, timing
                        t_last = now(engine.device)
                        continue  # the newcomers' first tokens may already have ended them
                    if not state.live():
                        continue  # the last answers just ended: nothing left to step
                if t_last is None:
                    t_last = now(engine.device)
                if clock is not None:
                    clock()
                state.step()
                if clock is not None:
                    clock()
    except Exception:
        if cut is not None:  # the steps decoded so far made the answers already given
            cut.append(loop_timing(decode_s + (now(engine.device) - t_last if t_last is not None else 0.0)))
        raise
    if t_last is not None:
        decode_s += now(engine.device) - t_last
    if state.t > 1:
        engine.policy.observe(engine.shape_key(engine.last_shape), decode_s * 1000 / state.t)
    yield [], loop_timing(decode_s)
    engine.admissions = (f"continuous batching: {admitted} request(s) admitted into {state.batch} decode rows as "
                         f"rows freed ({policy.name}; {waited} answer(s) waited, prefilled, for a row); "
                         f"{state.t} decode steps")


def steps_to_go(state, answers: int, mean: float, max_new: int) -> int:
    """What the rest of a run would cost in steps: ``answers`` still to decode (waiting, parked, live) ×
    ``mean`` (the length of the answers that ended so far) over the rows, and no less than the live answers
    still need — one that ran k tokens is taken to run k more: the answers that end first are the short
    ones, so their mean alone says "a step or two to go" while rows still run."""
    live = [min(k, max_new - k) for k, owner in zip(state.produced, state.owner) if owner is not None]
    return max(int(answers * mean / state.batch), max(live, default=0))


def decode_state(engine, width: int, length: int, carry=None):
    """The decode state a continuous run steps: ``width`` rows of a cache of ``length`` positions or more,
    eager or static as the engine's batches are (a static shape is built once and kept), every row free —
    or holding the rows of ``carry``, a state the run outgrew (a longer prompt, a compiled step)."""
    import torch

    from vlmfast.engines.hf.capacity import batch_bucket, length_bucket

    engine.last_shape = (batch_bucket(width) if engine.cuda_graphs else width, length_bucket(length))
    with torch.inference_mode():
        static = engine.cuda_graphs or engine.policy.enabled
        state = engine._static_state() if static else engine._new_state(width, engine.last_shape[1], static=False)
        state.reset()
        if carry is not None and carry is not state:
            state.take(carry)
            if all(carry is not kept for kept in engine._static.values()):
                carry.release()  # its memory now, not at the next garbage collection
    return state


def _admit(engine, state, take: list[Request], held: dict[str, Held], parked: deque, prefetched=None):
    """Prepare and prefill ``take`` and copy its caches into free rows (answers that find none are
    ``parked``); returns error rows of requests whose images failed, the admission's timing, the state
    (a bigger one when a prompt did not fit) and how many answers it admitted (a resumed request's answers
    already written are not: :attr:`Request.answered`)."""
    n = engine.settings.n
    t0 = now(engine.device)
    prepared = engine.prepare(take, prefetched)
    t1 = now(engine.device)
    errors = [error_row(r.id, r, prepared.failed[r.id]) for r in take if r.id in prepared.failed]
    if not prepared.requests:
        return errors, None, state, 0
    prefilled = engine.prefill(prepared)
    t2 = now(engine.device) - prefilled.compile_s  # compiling vision blocks is not the time to a first token
    engine.policy.compile_s += prefilled.compile_s
    widest = max(g.key_valid.shape[1] for g in prefilled.groups)
    if widest + engine.settings.max_new_tokens > state.max_len:
        state = decode_state(engine, state.batch, widest + engine.settings.max_new_tokens, carry=state)
    t3, free = now(engine.device), state.free_rows()  # (a bigger state above is the cache's growth, not a fill)
    answers = 0
    for g, group in zip(prepared.groups, prefilled.groups):
        # a resumed request's answers already written are not decoded again
        wanted = [(j * n + k, (r.id, k)) for j, r in enumerate(prepared.requests[g.start:g.end]) for k in range(n)
                  if k not in r.answered]
        newcomers = Parked(group, [row for row, _ in wanted], [owner for _, owner in wanted])
        answers += len(wanted)
        free = newcomers.seat(state, free)
        if newcomers.pick:
            parked.append(newcomers)
    prepared.groups = []  # the inputs are in the cache now: only counts and sizes stay for the result rows
    t4 = now(engine.device)
    for r in prepared.requests:
        held[r.id] = Held(r, prepared, sum(k not in r.answered for k in range(n)))
    worker_s, waited_s = (prefetched.worker_s, prefetched.waited_s) if prefetched else (0.0, 0.0)
    timing = BatchTiming(size=len(prepared.requests), preprocess_s=t1 - t0 + worker_s, ttft_s=t2 - t1, decode_s=0.0,
                         steps=0, new_tokens=0, preprocess_exposed_s=t1 - t0 + waited_s, vision_s=prefilled.vision_s,
                         cache_fill_s=t4 - t3)
    return errors, timing, state, answers


def _seat(state, parked: deque, free: list[int]) -> tuple[list[int], int]:
    """Free rows to the answers that wait prefilled, first come first seated; returns the rows still free
    and how many answers took one."""
    seated = 0
    while parked and free:
        seated += min(len(free), len(parked[0].pick))
        free = parked[0].seat(state, free)
        if not parked[0].pick:
            parked.popleft()
    return free, seated


def _finished(engine, answers, held: dict[str, Held]) -> list[SampleResult]:
    """Result rows of answers that ended; a request is let go when its last answer is in."""
    n = engine.settings.n
    rows = []
    for (rid, sample), tokens in answers:
        h = held[rid]
        rows.append(engine.result(h.request, h.prepared, tokens, sample if n > 1 else None))
        h.out -= 1
        if not h.out:
            del held[rid]
    return rows
