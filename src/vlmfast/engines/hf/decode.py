"""The decode loop: one token for every row per step, over the HF model's own modules.

``model.generate`` spends most of a small model's decode step on host work (mask building, kwargs
plumbing, logits processors, a host sync per token). Here a step is only the language model's layers
(the same modules, the same numerics) on a preallocated KV cache, selection on the device, and EOS
tracked on the device and read back every ``sync_every`` steps.

One state (:class:`DecodeState`), two ways to run its step: eager, exactly as ``generate`` attends, or
static (fixed shapes for CUDA graphs and ``torch.compile``). :func:`run_loop` steps any of them.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch
from transformers import AttentionInterface

from vlmfast.engines.hf.linear_states import LinearStateCache, check_cache_api, linear_modules
from vlmfast.engines.hf.fused import Fused, decode_weights, fuse_projections, fused_projections, packing_plan
from vlmfast.engines.hf.sampling import select, token_hashes


class StaticKV(LinearStateCache):
    """Keys and values of every full-attention layer, preallocated for ``max_len`` positions of ``batch``
    rows; a hybrid model's linear-attention layers (``linear``: layer index → module) keep their
    states instead (:class:`~vlmfast.engines.hf.linear_states.LinearStateCache`).

    The attention modules call ``update(key, value, layer_idx[, cache_kwargs])`` — the only cache
    method a decoder layer uses on transformers 4.57 and 5.x. Eager mode writes at the host-side
    ``length`` and returns the filled slice; static mode (``index`` set) writes at a device-side index
    and returns the whole buffer, to be masked."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype, device,
                 linear: dict | None = None):
        shape = (batch, kv_heads, max_len, head_dim)
        linear = linear or {}
        self.keys = [None if i in linear else torch.zeros(shape, dtype=dtype, device=device) for i in range(layers)]
        self.values = [None if i in linear else torch.zeros(shape, dtype=dtype, device=device) for i in range(layers)]
        self.init_linear_states(linear, batch, device)
        self.batch, self.max_len, self.dtype = batch, max_len, dtype
        self.length = 0
        self.index: torch.Tensor | None = None
        self.attend: int | None = None  # static mode: keys attended to (a multiple of ATTEND_STEP), None: all

    def fill(self, caches, length: int, repeat: int = 1) -> None:
        """Copy prefill caches — (start row, end row, HF cache) per prefill group — into the first
        ``length`` positions, each group right-aligned (its shorter prompts read as left padding). With
        ``repeat`` each prompt row fills ``repeat`` consecutive rows (n answers from one prefill)."""
        self.fill_linear_states(caches, repeat)
        for start, end, cache in caches:
            for i, layer in enumerate(cache.layers):
                if self.keys[i] is None:
                    continue
                n = layer.keys.shape[2]
                keys, values = layer.keys, layer.values
                if repeat > 1:
                    keys, values = keys.repeat_interleave(repeat, 0), values.repeat_interleave(repeat, 0)
                self.keys[i][start * repeat:end * repeat, :, length - n:length].copy_(keys)
                self.values[i][start * repeat:end * repeat, :, length - n:length].copy_(values)
        self.length = length

    def update(self, key, value, layer_idx: int, cache_kwargs=None, **kwargs):  # 5.24 adds kwargs=…
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if self.index is not None:
            k.index_copy_(2, self.index, key)
            v.index_copy_(2, self.index, value)
            return (k, v) if self.attend is None else (k[:, :, :self.attend], v[:, :, :self.attend])
        end = self.length + key.shape[2]
        k[:, :, self.length:end] = key
        v[:, :, self.length:end] = value
        return k[:, :, :end], v[:, :, :end]

    def advance(self) -> None:
        """One position written by every layer: move the write position on."""
        if self.index is not None:
            self.index += 1
        else:
            self.length += 1


class TextDecoder:
    """The language model of a Qwen-VL model (Qwen2-VL to Qwen3.5) called layer by layer for new
    tokens: embedding, 3-D rotary positions, the decoder layers with a caller-made mask, final norm, LM
    head. Qwen3.5's linear-attention layers get no mask (a new token is never padding) and keep their
    states in the cache's linear half."""

    def __init__(self, model):
        text = model.model.language_model
        self.embed, self.rotary, self.layers, self.norm = text.embed_tokens, text.rotary_emb, text.layers, text.norm
        self.lm_head = model.lm_head
        config = model.config.get_text_config()
        self.linear = linear_modules(self.layers)
        if self.linear:
            check_cache_api()
        # Q/K/V and gate/up as one product each in decode steps; on a CPU, every product on a packed weight
        self.packed, self.pack_note = packing_plan(decode_weights(self.layers, self.lm_head))
        self.fused = fuse_projections(self.layers, pack=self.packed)
        self.head = Fused([self.lm_head], pack=True) if self.packed else None  # the module stays: ties hold
        if self.head is not None:
            self.fused.append(self.head)
        # transformers 5.24 renamed the layers' ``past_key_values`` argument ``cache`` (the old name still
        # works through a shim that warns at every call): pass the name this version's layers take
        self.cache_arg = "cache" if "cache" in inspect.signature(self.layers[0].forward).parameters else "past_key_values"
        attention = next(layer.self_attn for layer in self.layers if hasattr(layer, "self_attn"))
        self.attention_config = attention.config  # what the attention modules read per call
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.vocab = config.vocab_size

    def new_cache(self, batch: int, max_len: int) -> StaticKV:
        weight = self.lm_head.weight
        return StaticKV(len(self.layers), batch, self.kv_heads, max_len, self.head_dim, weight.dtype, weight.device,
                        linear=self.linear)

    def __call__(self, tokens, positions, mask, cache: StaticKV):
        """Logits (batch, vocab, float32) of the next token after ``tokens`` (batch, 1) at ``positions``
        (3, batch, 1); ``mask`` (batch, 1, 1, keys) bool or None (no padding: every key is seen)."""
        hidden = self.embed(tokens)
        rotary = self.rotary(hidden, positions)
        for i, layer in enumerate(self.layers):
            out = layer(hidden, attention_mask=None if i in self.linear else mask, position_embeddings=rotary,
                        use_cache=True, **{self.cache_arg: cache})
            hidden = out[0] if isinstance(out, tuple) else out  # 4.57 layers return a tuple
        last = self.norm(hidden)[:, -1, :]
        head = self.head
        return (head.part(last, 0) if head is not None and head.active else self.lm_head(last)).float()


DECODE_ATTENTION = "vlmfast_decode"


def decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """Attention for new tokens against the cache, as an attention function of transformers'.

    With grouped-query attention the queries that share a key/value head are packed into one
    sequence per kv head (what transformers 5.x does for one query token), so keys and values are
    read in place: transformers 4.57 copies them once per query head (``repeat_kv``) at every step,
    which measured a third of a decode step on a CPU. Returns (batch, new tokens, heads, head dim)."""
    batch, heads, q_len, dim = query.shape
    groups = heads // key.shape[1]
    if groups > 1 and q_len == 1:
        query = query.reshape(batch, key.shape[1], groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=0.0, scale=scaling, is_causal=False)
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(DECODE_ATTENTION, decode_attention)


@contextlib.contextmanager
def decode_attention_for(decoder: TextDecoder):
    """Decode attention runs through :func:`decode_attention` whatever the model was loaded with:
    flash-attn's padded path unpads with a host sync and takes a 2-D mask; eager attention wants an
    additive mask. Switched outside any compiled region: it sets a config attribute."""
    config = decoder.attention_config
    loaded_with = config._attn_implementation
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = loaded_with


def rope_positions(model, inputs):
    """Qwen2.5-VL's 3-D rotary positions of the prompt (3, batch, length), from the model's own
    ``get_rope_index`` (its signature differs across transformers versions)."""
    accepted = inspect.signature(model.model.get_rope_index).parameters
    extra = {k: inputs[k] for k in ("image_grid_thw", "video_grid_thw", "attention_mask", "mm_token_type_ids",
                                    "second_per_grid_ts") if k in accepted and k in inputs}
    positions, _ = model.model.get_rope_index(inputs["input_ids"], **extra)
    return positions


def suppress_bias(vocab: int, token_ids, device) -> torch.Tensor:
    """Added to the logits: -inf on tokens never to emit (vision placeholders), 0 elsewhere."""
    bias = torch.zeros(vocab, device=device)
    if token_ids:
        bias[list(token_ids)] = float("-inf")
    return bias


@dataclass
class Decoded:
    tokens: list[list[int]]  # per row: every generated token (pad after the row's EOS), first token included
    steps: int  # tokens produced per row, the first one (from prefill) included
    syncs: int  # device read-backs during the loop


class DecodeState:
    """Everything one batch's decode needs on the device: the KV cache, last tokens, rotary positions,
    which keys are padding, which rows still run, and the output buffer. ``step()`` produces one more
    token for every row.

    Two ways to run the same state:
    - eager (``static=False``, any device): the cache is sliced to the filled length, so attention sees
      exactly the keys HF's dynamic cache would, and greedy tokens equal ``generate``'s;
    - static (CUDA graphs, ``torch.compile``): fixed shapes — the cache with an additive mask, the write
      index and the step offset as device tensors, so a step never needs the host. Built once per
      (batch, cache length) shape and reused by every batch of that shape; rows beyond a batch are spare.
      Uncompiled (CUDA graphs alone) a step attends to the filled keys rounded up to ``ATTEND_STEP``,
      a graph per such length, chosen on the host from the step count; compiled, to the whole cache
      (each length would be a compile of its own).

    ``forward`` is :func:`forward_eager`, :func:`forward_static` or a compiled ``forward_static``: a plain
    function of the state, never a bound method, so a state holds no reference to itself and its memory
    goes as soon as it is released (a graph pool and a KV cache per shape are gigabytes on a GPU)."""

    def __init__(self, decoder: TextDecoder, batch: int, max_len: int, max_new: int, *, static: bool, eos_ids,
                 pad_id: int, bias, temperature: float, top_p: float, forward=None, attend_buckets: bool = False):
        device = bias.device
        long = dict(dtype=torch.long, device=device)
        self.decoder, self.batch, self.max_len, self.max_new, self.static = decoder, batch, max_len, max_new, static
        self.bias, self.temperature, self.top_p = bias, temperature, top_p
        self.cache = decoder.new_cache(batch, max_len)
        if static:
            self.cache.index = torch.zeros(1, **long)
        self.forward = forward or (forward_static if static else forward_eager)
        self.fuse = self.forward in (forward_eager, forward_static)  # not inside a compiled step
        self.eos = torch.tensor(list(eos_ids), **long)
        self.pad = torch.tensor(pad_id, **long)
        self.tokens = torch.full((batch, 1), pad_id, **long)
        self.next_position = torch.zeros(3, batch, 1, **long)  # where each row's first generated token sits
        self.offset = torch.zeros(1, **long)  # tokens produced so far, minus one
        self.key_valid = torch.ones(batch, max_len, dtype=torch.bool, device=device)  # False on prompt padding
        self.keys = torch.arange(max_len, device=device)
        # one spare column: warm-up and capture steps run on garbage before load() and write at offset + 1,
        # which without it is past the end when max_new is small; run_loop never reads past max_new
        self.out = torch.full((batch, max_new + 1), pad_id, **long)
        self.running = torch.zeros(batch, dtype=torch.bool, device=device)
        self.row_keys = torch.zeros(batch, **long)  # sampling: each row's own noise (spare rows: key 0, ignored)
        self.hashed_tokens = token_hashes(bias.shape[0], device) if temperature != 0 else None
        self.padded = True
        self.logits = None
        # static: the key lengths a step may attend to — every ATTEND_STEP up to the cache's length (a graph
        # each), so a step reads what is filled, not the whole cache; one length (all) for a compiled step
        steps = range(ATTEND_STEP, max_len, ATTEND_STEP) if attend_buckets and static else ()
        self.attends = (*steps, max_len)
        self.graphs: dict[int, object] = {}
        self.rows = self.t = self.prompt_len = 0

    def load(self, *, first, next_position, key_valid, caches, prompt_len: int, repeat: int = 1, keys=None) -> None:
        """Take a new batch: its prefill caches (each prompt's copied to ``repeat`` rows), first tokens,
        positions, padding and sampling keys (per decode row). Spare rows (static shapes) are not running
        and attend to everything (no empty softmax)."""
        rows = first.shape[0]
        self.rows, self.t, self.prompt_len = rows, 1, prompt_len
        self.cache.fill(caches, prompt_len, repeat)
        if self.static:
            self.cache.index.fill_(prompt_len)
        self.offset.zero_()
        self.tokens.fill_(int(self.pad))
        self.tokens[:rows, 0] = first
        self.next_position.zero_()
        self.next_position[:, :rows] = next_position
        self.key_valid.fill_(True)
        self.key_valid[:rows, :key_valid.shape[1]] = key_valid
        self.padded = not bool(key_valid.all())
        self.out.fill_(int(self.pad))
        self.out[:rows, 0] = first
        self.running.fill_(False)
        self.running[:rows] = ~torch.isin(first, self.eos) if len(self.eos) else True
        self.row_keys.zero_()
        if keys is not None:
            self.row_keys[:rows] = keys

    def record(self, logits) -> None:
        """Select the next token of every row, record it (pad for finished rows), advance by one."""
        chosen = select(logits, self.bias, temperature=self.temperature, top_p=self.top_p, keys=self.row_keys,
                        step=self.offset + 1, hashed_tokens=self.hashed_tokens)
        chosen = torch.where(self.running, chosen, self.pad)
        self.out.index_copy_(1, self.offset + 1, chosen[:, None])
        self.tokens.copy_(chosen[:, None])
        if len(self.eos):
            self.running &= ~torch.isin(chosen, self.eos)
        self.offset += 1
        self.cache.advance()

    def _body(self) -> None:
        """One step as a CUDA graph holds it: the forward and the choice of the next token (a draw is a
        pure function of device tensors: :mod:`vlmfast.engines.hf.sampling`)."""
        with decode_attention_for(self.decoder), fused_projections(self.decoder.fused, self.fuse):
            self.logits = self.forward(self)
        self.record(self.logits)

    def step(self) -> None:
        attend = self._attend()
        if self.graphs:
            self.graphs[attend].replay()
        else:
            if self.static:
                self.cache.attend = attend
            self._body()
        self.t += 1

    def _attend(self) -> int:
        """The shortest attended length that holds every key this step sees (prompt, then tokens so far)."""
        needed = self.prompt_len + self.t
        return next((a for a in self.attends if a >= needed), self.attends[-1])

    @property
    def graph(self):
        """A captured step (the one over the whole cache), or None."""
        return self.graphs.get(self.attends[-1])

    def warm_up(self) -> None:
        """One step on garbage (a compiled forward compiles here); :meth:`load` resets what it wrote."""
        self.offset.zero_()
        if self.static:
            self.cache.attend = self.attends[-1]
        self._body()

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
                        self.offset.zero_()  # each warm-up writes column 1, whatever max_new is
                        self._body()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    self._body()
                pool = pool or graph.pool()
                self.graphs[attend] = graph

    def any_running(self) -> bool:
        return bool(self.running.any())  # the read-back: a host sync on an accelerator

    def release(self) -> None:
        """Give back the cache, the graph and its memory pool now (not at the next garbage collection)."""
        for graph in self.graphs.values():
            graph.reset()
        self.graphs = {}
        self.cache = self.logits = self.out = self.key_valid = None


def forward_eager(state: DecodeState):
    """The next-token logits, attending to exactly the filled part of the cache."""
    cache = state.cache
    mask = state.key_valid[:, None, None, :cache.length + 1] if state.padded else None
    return state.decoder(state.tokens, state.next_position + state.offset, mask, cache)


def forward_static(state: DecodeState):
    """The next-token logits over the cache's first ``attend`` keys (all of them when unset): keys not yet
    written, and prompt padding, are masked by an additive mask in the model's dtype, made once per step
    (a boolean mask would be converted in every layer)."""
    cache = state.cache
    attend = cache.attend or cache.max_len
    seen = state.key_valid[:, :attend] & (state.keys[:attend] <= cache.index)
    dtype = cache.dtype
    mask = torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, torch.finfo(dtype).min)
    return state.decoder(state.tokens, state.next_position + state.offset, mask[:, None, None, :], cache)


def run_loop(loop, *, stop_on_eos: bool, sync_every: int, on_step=None) -> Decoded:
    """Step until ``max_new`` tokens, or — checked every ``sync_every`` steps — every row has ended.
    ``on_step(t)`` is called after each step (per-step clocks; it may synchronize)."""
    syncs = 0
    while loop.t < loop.max_new:
        if stop_on_eos and loop.t % sync_every == 0:
            syncs += 1
            if not loop.any_running():
                break
        loop.step()
        if on_step is not None:
            on_step(loop.t)
    steps = loop.t
    return Decoded(loop.out[:loop.rows, :steps].tolist(), steps, syncs)


# -- static shapes: CUDA graphs and torch.compile --------------------------------------------------
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
LENGTH_BUCKET = 256  # cache lengths are rounded up to a multiple of this, so batches share a captured graph
ATTEND_STEP = 256  # a static step attends to the filled keys rounded up to this: a graph per multiple


def batch_bucket(rows: int) -> int:
    """The captured batch size that serves ``rows`` (spare rows are padding, their output ignored)."""
    return next((b for b in BATCH_BUCKETS if b >= rows), rows)


def length_bucket(length: int) -> int:
    return -(-length // LENGTH_BUCKET) * LENGTH_BUCKET
