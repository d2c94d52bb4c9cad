"""The decode loop: one token for every row per step, over the HF model's own modules.

``model.generate`` spends most of a small model's decode step on host work (mask building, kwargs
plumbing, logits processors, a host sync per token). Here a step is only the language model's layers
(the same modules, the same numerics) on a preallocated KV cache, selection on the device, and EOS
tracked on the device and read back every ``sync_every`` steps.

Every row of the state is on its own: its own length, rotary position and token count. A row is given
an answer to produce by :meth:`DecodeState.admit` (a prefill group's cache copied in) and handed back
by :meth:`DecodeState.harvest` when the answer ended, so a row that ended can take the next request
while the others go on (:mod:`vlmfast.engines.hf.continuous`); a whole batch admitted at once and
stepped to its end is :func:`run_loop`.

One state, two ways to run its step: eager, exactly as ``generate`` attends (only the rows that still run
are computed, packed to the front), or static (CUDA graphs, ``torch.compile``: every row, device indices).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from vlmfast.engines.hf.fused import fused_projections
from vlmfast.engines.hf.kv import StaticKV  # noqa: F401 - the decode cache, importable from here
from vlmfast.engines.hf.moe import grouped_experts_for
from vlmfast.engines.hf.sampling import mark_seen, penalize, select, token_hashes
from vlmfast.engines.hf.text_decoder import (DECODE_ATTENTION, RowGroups, TextDecoder, decode_attention,  # noqa: F401
                                              decode_attention_for, forward_eager, forward_static, rope_positions,
                                              split_rows, static_attention, suppress_bias)


@dataclass
class Admission:
    """One prefill group ready for decode rows: each prompt row's first token(s) and rotary position,
    its padding, its HF cache, and (sampling) each decode row's key. With ``repeat`` > 1 every prompt
    row serves ``repeat`` decode rows (n answers from one prefill); ``first`` … are per decode row."""

    first: torch.Tensor  # (prompts × repeat,)
    next_position: torch.Tensor  # (3, prompts × repeat, 1)
    key_valid: torch.Tensor  # (prompts, width) bool: False on the group's left padding
    cache: object  # the group's HF cache
    keys: torch.Tensor | None = None  # (prompts × repeat,) sampling keys; None when greedy
    repeat: int = 1
    seen: torch.Tensor | None = None  # (prompts × repeat, vocab) bool: tokens a repetition penalty counts

    @property
    def rows(self) -> int:
        return self.first.shape[0]


@dataclass
class Decoded:
    tokens: list[list[int]]  # per decode row of the batch: its tokens up to its EOS, the first one included
    steps: int  # tokens produced by the longest row, the first one (from prefill) included
    syncs: int  # device read-backs during the loop
    row_steps: int = 0  # rows computed, summed over the steps (the denominator of row utilization)
    fill_s: float = 0.0  # copying the prefill caches into the decode rows, before the first step


class DecodeState:
    """Everything decode needs on the device, per row: the KV cache, the last token, the rotary position
    of the row's first answer token, how many tokens it produced, which prompt keys are padding, whether
    it still runs, its sampling key and its output. The host keeps its own view (which rows hold an
    answer, an upper bound of each row's length) so that a step never has to ask the device.

    - eager (``static=False``, any device): the live rows are packed to the front and only they are
      computed; attention reads exactly the filled keys (a mask only when rows differ in length or have
      padding), so greedy tokens equal ``generate``'s;
    - static (CUDA graphs, ``torch.compile``): every row of the shape is computed, over the filled keys
      rounded up to ``ATTEND_STEP`` (a graph per such length) or, compiled, over the whole cache, with an
      additive mask; rows that hold no answer compute garbage nobody reads.

    ``forward`` is :func:`forward_eager`, :func:`forward_static` or a compiled :func:`step_static`: a plain
    function of the state, never a bound method, so a state holds no reference to itself and its memory
    goes as soon as it is released (a graph pool and a KV cache per shape are gigabytes on a GPU)."""

    def __init__(self, decoder: TextDecoder, batch: int, max_len: int, max_new: int, *, static: bool, eos_ids,
                 pad_id: int, bias, temperature: float, top_p: float, forward=None, attend_buckets: bool = False,
                 penalty: float = 1.0):
        device = bias.device
        long = dict(dtype=torch.long, device=device)
        self.decoder, self.batch, self.max_len, self.max_new, self.static = decoder, batch, max_len, max_new, static
        self.bias, self.temperature, self.top_p = bias, temperature, top_p
        self.cache = decoder.new_cache(batch, max_len)
        self.forward = forward or (forward_static if static else forward_eager)
        # a static step that attends over the whole cache is a compiled one (an uncompiled one attends in buckets)
        self.attention = (static_attention(compiled=not attend_buckets, cuda=device.type == "cuda") if static
                          else DECODE_ATTENTION)
        self.eos = torch.tensor(list(eos_ids), **long)
        self.pad = torch.tensor(pad_id, **long)
        self.tokens = torch.full((batch, 1), pad_id, **long)
        self.next_position = torch.zeros(3, batch, 1, **long)  # where each row's first answer token sits
        self.count = torch.zeros(batch, **long)  # tokens each row produced, its first (from prefill) included
        self.key_valid = torch.ones(batch, max_len, dtype=torch.bool, device=device)  # False on prompt padding
        self.keys = torch.arange(max_len, device=device)
        # one spare column: a row that ended by length writes its (ignored) pad at column max_new
        self.out = torch.full((batch, max_new + 1), pad_id, **long)
        self.running = torch.zeros(batch, dtype=torch.bool, device=device)
        self.row_keys = torch.zeros(batch, **long)  # sampling: each row's own noise (free rows: key 0, ignored)
        self.hashed_tokens = token_hashes(bias.shape[0], device) if temperature != 0 else None
        # a repetition penalty: the tokens each row has seen, its prompt's and its answer's (None without one)
        self.penalty = penalty
        self.seen = torch.zeros(batch, bias.shape[0], dtype=torch.bool, device=device) if penalty != 1.0 else None
        self.logits = None
        # static: the key lengths a step may attend to — every ATTEND_STEP up to the cache's length (a graph
        # each), so a step reads what is filled, not the whole cache; one length (all) for a compiled step
        steps = range(ATTEND_STEP, max_len, ATTEND_STEP) if attend_buckets and static else ()
        self.attends = (*steps, max_len)
        self.graphs: dict[int, object] = {}
        self.reset()

    def reset(self) -> None:
        """Every row free. The host's view of a row: who holds it (None: free), whether its prompt has
        padding, an upper bound of its write column and of its token count (exact after each harvest),
        and its prompt's width."""
        self.owner: list[object] = [None] * self.batch
        self.padded = [False] * self.batch
        self.filled = [0] * self.batch
        self.produced = [0] * self.batch
        self.width = [0] * self.batch
        self.cache.active = self.batch if self.static else 0
        self.t = 0  # steps taken
        self.row_steps = 0  # rows computed, summed over steps
        self._split_for, self._split = None, []  # row_groups' split and the rows it was chosen for

    def take(self, other: DecodeState) -> None:
        """Every row of ``other`` (no more rows, a cache no longer than this one's) into the same rows here:
        a run moves on to a longer cache, or to a compiled step, without losing a token."""
        rows, length = other.batch, other.max_len
        for dst, src in zip(self.cache.keys + self.cache.values, other.cache.keys + other.cache.values):
            if dst is not None:
                dst[:rows, :, :length].copy_(src)
        self.cache.take_linear_states(other.cache)
        for name in ("tokens", "count", "out", "running", "row_keys") + (("seen",) if self.seen is not None else ()):
            getattr(self, name)[:rows].copy_(getattr(other, name))
        self.next_position[:, :rows].copy_(other.next_position)
        self.cache.write[:rows].copy_(other.cache.write)
        self.key_valid.fill_(True)
        self.key_valid[:rows, :length] = other.key_valid
        for name in ("owner", "padded", "filled", "produced", "width"):
            getattr(self, name)[:rows] = getattr(other, name)
        self.t, self.row_steps = other.t, other.row_steps
        if not self.static:
            self.cache.active = other.cache.active

    # -- rows in and out ---------------------------------------------------------------------------
    def free_rows(self) -> list[int]:
        """Rows that hold no answer, in the order admissions fill them (eager: right after the live rows)."""
        return [r for r in range(self.batch) if self.owner[r] is None]

    def live(self) -> int:
        return sum(o is not None for o in self.owner)

    def admit(self, group: Admission, rows: list[int], owners: list, pick: list[int] | None = None) -> None:
        """Give free ``rows`` the group's decode rows ``pick`` (all when None): caches copied in, first
        tokens, positions, padding and sampling keys set; ``owners`` tag the rows for :meth:`harvest`."""
        index = torch.tensor(rows, dtype=torch.long, device=self.count.device)
        chosen = (torch.arange(group.rows) if pick is None else torch.tensor(pick, dtype=torch.long)).to(group.first.device)
        prompts = chosen // group.repeat
        width = self.cache.admit(index, group.cache, prompts)
        valid = group.key_valid[prompts]
        self.key_valid[index] = True
        self.key_valid[index, :width] = valid[:, -width:] if valid.shape[1] >= width else valid
        first = group.first[chosen]
        self.tokens[index, 0] = first
        self.next_position[:, index] = group.next_position[:, chosen]
        self.count[index], self.out[index] = 1, self.pad
        self.out[index, 0] = first
        self.running[index] = ~is_stop(first, self.eos) & (self.max_new > 1)
        self.row_keys[index] = group.keys[chosen] if group.keys is not None else 0
        if self.seen is not None:
            self.seen[index] = group.seen[chosen]
        padded = (~valid).any(1).tolist()
        for k, r in enumerate(rows):
            self.owner[r], self.padded[r], self.filled[r], self.produced[r], self.width[r] = owners[k], padded[k], width, 1, width
        if not self.static:
            self.cache.active = max(self.cache.active, max(rows) + 1)

    def harvest(self) -> list[tuple[object, list[int]]]:
        """(owner, tokens up to the EOS) of every row whose answer ended since the last harvest; their
        rows become free. One read-back of the device (a host sync on an accelerator)."""
        running, count, write = torch.stack([self.running.long(), self.count, self.cache.write]).tolist()
        done = [r for r in range(self.batch) if self.owner[r] is not None and not running[r]]
        outs = self.out[done].tolist() if done else []
        finished = [(self.owner[r], out[:count[r]]) for r, out in zip(done, outs)]
        for r in range(self.batch):
            self.filled[r], self.produced[r] = write[r], count[r]
        for r in done:
            self.owner[r] = None
        return finished

    def pack(self) -> None:
        """Eager: close the gaps rows that ended left, keeping the live rows' order, so a step computes
        ``[0, live)`` only. Rows come in at the end, so the order is the order of admission: longest
        answers first, which keeps rows of similar lengths together (:meth:`row_groups`). Right after
        :meth:`harvest` (the host's lengths are exact): only the filled keys move."""
        if self.static:
            return
        live = [r for r in range(self.batch) if self.owner[r] is not None]
        for dst, src in enumerate(live):  # ascending, so a row never lands on one still to move
            if src != dst:
                self._move(src, dst)
        self.cache.active = len(live)

    def _move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst, self.filled[src])
        for buffer in (self.tokens, self.count, self.key_valid, self.out, self.running, self.row_keys, self.seen):
            if buffer is not None:
                buffer[dst] = buffer[src]
        self.next_position[:, dst] = self.next_position[:, src]
        for view in (self.owner, self.padded, self.filled, self.produced, self.width):
            view[dst] = view[src]
        self.owner[src] = None

    def rewind(self) -> None:
        """Every row that ever held an answer holds it again from its first answer token (profiling and
        tests step the same steps again after a run). The repetition penalty's seen tokens keep the answer's:
        the steps cost the same, but their tokens may differ from the first run's under a penalty."""
        for r in range(self.batch):
            if self.width[r]:
                self.cache.write[r], self.count[r], self.running[r] = self.width[r], 1, True
                self.owner[r] = self.owner[r] if self.owner[r] is not None else r
                self.filled[r], self.produced[r] = self.width[r], 1
        self.t = 1

    # -- one step ----------------------------------------------------------------------------------
    def record(self, logits) -> None:
        """Select the next token of every computed row, record it (pad for rows that ended), move the
        rows that ran on by one."""
        rows = self.cache.active
        running, count = self.running[:rows], self.count[:rows]
        logits = logits if self.seen is None else penalize(logits.float(), self.seen[:rows], self.penalty)
        chosen = select(logits, self.bias, temperature=self.temperature, top_p=self.top_p, keys=self.row_keys[:rows],
                        step=count, hashed_tokens=self.hashed_tokens)
        chosen = torch.where(running, chosen, self.pad)
        if self.seen is not None:
            mark_seen(self.seen[:rows], chosen, running)
        self.out[:rows].scatter_(1, count[:, None], chosen[:, None])
        self.tokens[:rows].copy_(chosen[:, None])
        ran = running.long()
        self.cache.write[:rows] += ran
        count += ran
        running &= ~is_stop(chosen, self.eos)
        running &= count < self.max_new

    @contextlib.contextmanager
    def step_context(self):
        """What every step runs inside, eager, captured or compiled: decode attention, fused projections, the
        routed experts' offsets by one search."""
        with decode_attention_for(self.decoder, self.attention), fused_projections(self.decoder.fused), \
                grouped_experts_for(self.decoder.experts):
            yield

    def _body(self) -> None:
        """One step as a CUDA graph holds it: the forward and the choice of the next token (a draw is a
        pure function of device tensors: :mod:`vlmfast.engines.hf.sampling`)."""
        with self.step_context():
            self.logits = self.forward(self)
        if self.forward in (forward_eager, forward_static):  # a compiled step chose its tokens itself
            self.record(self.logits)

    def step(self) -> None:
        attend = self._attend()
        if self.graphs:
            self.graphs[attend].replay()
        else:
            self.cache.attend = attend
            self._body()
        self.t += 1
        self.row_steps += self.cache.active
        for r in range(self.batch):  # the host's upper bound: a held row ran unless it ended meanwhile
            if self.owner[r] is not None and self.produced[r] < self.max_new:
                self.filled[r] += 1
                self.produced[r] += 1

    @property
    def ragged(self) -> bool:
        """Whether the computed rows need a mask: prompt padding, or rows of different lengths."""
        held = [r for r in range(self.cache.active) if self.owner[r] is not None]
        return any(self.padded[r] for r in held) or len({self.filled[r] for r in held}) > 1

    def row_groups(self) -> list[tuple[int, int, int, bool]]:
        """Eager: the computed rows in contiguous groups that each attend over their longest row's keys
        (first row, end row, keys, whether the group needs a mask). The split is chosen again only when
        the rows change hands: between admissions every row grows by one key a step."""
        rows = self.cache.active
        holders = tuple(self.owner[:rows])
        if self._split_for != holders:
            self._split_for, self._split = holders, split_rows([self.filled[r] + 1 for r in range(rows)])
        return [(a, b, min(max(self.filled[a:b]) + 1, self.cache.attend),
                 any(self.padded[a:b]) or len(set(self.filled[a:b])) > 1) for a, b in self._split]

    def _attend(self) -> int:
        """The shortest attended length that holds every key a held row sees this step (its prompt, its
        tokens so far and the one written now): exact when eager, a bucket when static."""
        needed = max((self.filled[r] + 1 for r in range(self.batch) if self.owner[r] is not None), default=1)
        if not self.static:
            return min(needed, self.max_len)
        return next((a for a in self.attends if a >= needed), self.attends[-1])

    @property
    def graph(self):
        """A captured step (the one over the whole cache), or None."""
        return self.graphs.get(self.attends[-1])

    def warm_up(self) -> None:
        """One step on garbage (a compiled forward compiles here); admissions overwrite what it wrote."""
        self.cache.attend = self.attends[-1]
        self._body()
        self._clear()

    def capture(self, warmup: int = 2) -> None:
        """Record a step in a CUDA graph per attended length (after warm-up runs on a side stream, as capture
        requires), the graphs sharing one memory pool (they never run at once). ``thread_local`` capture:
        the prefetch worker may allocate or copy on its own thread meanwhile, which the default
        (``global``) mode turns into a capture error."""
        pool = None
        with torch.cuda.device(self.bias.device):  # the model's GPU, whichever is current
            for attend in reversed(self.attends):  # the longest first: its pool fits every shorter step
                self.cache.attend = attend
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(warmup):
                        self._body()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    self._body()
                pool = pool or graph.pool()
                self.graphs[attend] = graph
        self._clear()

    def _clear(self) -> None:
        """No row runs, every write index and count at zero (after steps run on garbage)."""
        self.running.fill_(False)
        self.count.zero_()
        self.cache.write.zero_()

    def any_running(self) -> bool:
        return bool(self.running.any())  # the read-back: a host sync on an accelerator

    def release(self) -> None:
        """Give back the cache, the graph and its memory pool now (not at the next garbage collection)."""
        for graph in self.graphs.values():
            graph.reset()
        self.graphs = {}
        self.cache = self.logits = self.out = self.key_valid = None


def step_static(state: DecodeState):
    """:func:`forward_static` and the choice of each row's next token, one function: what ``torch.compile``
    compiles, so that selection (temperature, top-p, the hashed noise of a draw) joins the step's graph
    instead of running as a dozen small kernels after it."""
    state.record(logits := forward_static(state))
    return logits


def is_stop(tokens: torch.Tensor, stops: torch.Tensor) -> torch.Tensor:
    """Which tokens stop: one compare, which a CUDA graph captures (``torch.isin`` syncs on a large set)."""
    return (tokens[..., None] == stops).any(-1)


def run_loop(state: DecodeState, *, stop_on_eos: bool, sync_every: int, on_step=None) -> Decoded:
    """A batch admitted at once, stepped until ``max_new`` tokens or — checked every ``sync_every``
    steps — every row has ended (an eager state stops computing rows that ended). Rows are owned by
    their index in the batch. ``on_step(t)`` is called after each step (per-step clocks; it may sync)."""
    rows = state.live()
    tokens: dict[int, list[int]] = {}
    syncs = 0
    state.t, state.row_steps = 1, rows  # each row's first token came from prefill: one row-step each
    while state.t < state.max_new:
        if stop_on_eos and state.t % sync_every == 0:
            syncs += 1
            tokens.update(state.harvest())
            if not state.live():
                break
            state.pack()
        state.step()
        if on_step is not None:
            on_step(state.t)
    tokens.update(state.harvest())
    return Decoded([tokens[i] for i in range(rows)], state.t, syncs, state.row_steps)


ATTEND_STEP = 256  # a static step attends to the filled keys rounded up to this: a graph per multiple
