"""Batched generation for one batch at a time, phase by phase, with honest clocks:

- ``prepare``  images decoded and resized (Qwen's rule, our pixel limits), chat template, processor:
               padded CPU tensors (a prefetch worker may make them; prefill moves them to the device).
- ``prefill``  vision tower + prompt through the HF model, the first new token chosen on the device.
               Its end is the time to first token (TTFT).
- ``decode``   the step loop of :mod:`vlmfast.engines.hf.decode` over the language model's own modules; on CUDA
               replayed from a CUDA graph per (batch, cache length) shape.
- ``results``  token ids → text, think/answer, finish reason, token counts.

``decoder="hf"`` runs plain ``model.generate`` instead: the reference the loop is tested against and the
fallback for families the loop does not know. Batching, prefetch and out-of-memory halving are
:mod:`vlmfast.engines.hf.scheduler`'s; clocks synchronize the device before every read (:mod:`vlmfast.timing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vlmfast.checkpoints.load import Loaded
from vlmfast.engines.hf import DECODERS, check_cuda_graphs, check_decoder
from vlmfast.engines.hf.capacity import PREFILL_TOKENS, batch_bucket, length_bucket
from vlmfast.engines.hf.compile_policy import CompilePolicy
from vlmfast.engines.hf.plain_generate import PlainGenerate
from vlmfast.engines.hf.shapes import DecodeShapes
from vlmfast.errors import check_choice
from vlmfast.inputs.requests import Request
from vlmfast.engines.prepare import Preparer
from vlmfast.engines.rows import BatchTiming, GenerationSettings, SampleResult, error_row, result_row, run_seed
from vlmfast.timing import StepTimes, now, vision_clock

CUDA_SYNC_EVERY = 8  # CUDA: one EOS read-back per 8 steps keeps the host ahead of the GPU; a CPU reads back for free


@dataclass
class PrefillGroup:
    """Consecutive rows ``start:end`` of a batch that go through prefill together, and their tensors
    (on the CPU until prefill moves them: a prefetch worker makes them while the GPU is busy)."""

    start: int
    end: int
    inputs: object
    positions: object = None  # the prompts' rotary positions (3, rows, length), made with the inputs


@dataclass
class Prepared:
    """A batch ready for the model: the requests that will run (in prefill groups), and the ones that
    failed to decode (by id, with the reason)."""

    requests: list[Request]
    groups: list[PrefillGroup]
    failed: dict[str, str]
    model_sizes: dict[str, list[list[int]]]  # id → [width, height] per image after resizing
    counts: dict[str, tuple[int, int]]  # id → (prompt tokens, image tokens)


@dataclass
class Prefetched:
    """What a prefetch worker made ready for a batch while the previous one generated: decoded
    images, or (on a GPU) the whole Prepared on the CPU; how long that took and how long the model waited."""

    images: dict[str, list]
    failed: dict[str, str]
    worker_s: float
    waited_s: float = 0.0
    prepared: Prepared | None = None


@dataclass
class Prefilled:
    """What prefill hands to decode: one :class:`~vlmfast.engines.hf.decode.Admission` per prefill group,
    in the batch's order (each group's rows keep their own padding and length)."""

    groups: list
    vision_s: float | None = None  # the vision tower's share of the prefill
    compile_s: float = 0.0  # prefill time spent compiling the vision blocks (kept out of the TTFT)

    @property
    def rows(self) -> int:
        return sum(g.rows for g in self.groups)


class Engine(Preparer, PlainGenerate, DecodeShapes):
    """Runs one batch of requests through a :class:`~vlmfast.checkpoints.load.Loaded` model. Pixel limits,
    the chat template, image decoding, costs and the context check are :class:`~vlmfast.engines.prepare.Preparer`'s."""

    def __init__(self, loaded: Loaded, settings: GenerationSettings, *, min_pixels: int | None = None,
                 max_pixels: int | None = None, record_steps: bool = False, decoder: str = "vlmfast",
                 cuda_graphs: bool | None = None, compile: bool | None = False, sync_every: int | None = None,
                 compile_cache=None, max_batch_tokens: int | None = None, compiler=None, resize_rule: str = "qwen"):
        from vlmfast.checkpoints.families import decode_choice
        from vlmfast.engines.hf.moe import dynamic_experts

        check_choice("--decoder", decoder, DECODERS)
        check_decoder(decoder, compile, cuda_graphs)
        # what the model's family (a family the loop does not know runs plain generate) and its experts allow, said aloud
        dynamic = dynamic_experts(loaded.model, loaded.runtime.device) if decoder == "vlmfast" else None
        decoder, compile, cuda_graphs, self.notes = decode_choice(loaded.family, decoder, compile, cuda_graphs, dynamic)
        self.loaded, self.settings = loaded, settings
        from vlmfast.engines.generation_config import generation_config_processors

        self.penalty, self.config_notes = generation_config_processors(loaded.model.generation_config, decoder,
                                                                       settings.repetition_penalty, sampling=not settings.greedy,
                                                                       where=loaded.config_dir / "generation_config.json")
        self.notes = self.notes + self.config_notes
        self.device, self.on_cuda = loaded.runtime.device, loaded.runtime.device.startswith("cuda")
        self.decoder_name = decoder
        self.cuda_graphs = (self.on_cuda and decoder == "vlmfast") if cuda_graphs is None else cuda_graphs
        check_cuda_graphs(self.cuda_graphs, self.on_cuda)
        if decoder == "vlmfast":
            from vlmfast.engines.hf.text_decoder import static_attention

            static_attention(compiled=False, cuda=False)  # a misspelt VLMFAST_DECODE_ATTENTION stops here, not at the first static step
        self.policy = CompilePolicy(compile if decoder == "vlmfast" else False, device=self.device,
                                    cache=compile_cache, compiler=compiler)
        self.sync_every = sync_every or (CUDA_SYNC_EVERY if self.on_cuda else 1)
        self.record_steps = record_steps
        self.max_batch_tokens = max_batch_tokens or PREFILL_TOKENS["cuda" if self.on_cuda else "cpu"]
        super().__init__(loaded.processor, getattr(loaded.model.config.get_text_config(), "max_position_embeddings", None),
                         min_pixels=min_pixels, max_pixels=max_pixels, resize_rule=resize_rule)
        self._text = self._bias = None
        # sampling draws are keyed by (seed, request id, sample): without --seed, one seed drawn for this engine
        self.seed = run_seed(settings.seed)
        self._static: dict[tuple[int, int], object] = {}  # (batch, cache length) → a static DecodeState
        self.last_shape: tuple[int, int] | None = None  # the static shape the last batch had (or would have)
        self.admissions: str | None = None  # what the last continuous run did, said in the report
        # on CUDA the vision blocks compile with the decode step (off after a failed compile); a CPU's prefill
        # is bound by its products, not by passes over memory
        self.compile_vision = self.on_cuda

    # -- the whole path of one batch -------------------------------------------------------------
    def generate_batch(self, batch: Sequence[Request], prefetched: Prefetched | None = None
                       ) -> tuple[list[SampleResult], BatchTiming | None]:
        """Results for ``batch`` in its order; requests whose images fail to decode get error rows."""
        t0 = now(self.device)
        prepared = self.prepare(batch, prefetched)
        t1 = now(self.device)
        errors = {r.id: error_row(r.id, r, prepared.failed[r.id]) for r in batch if r.id in prepared.failed}
        if not prepared.requests:
            return [errors[r.id] for r in batch], None
        steps_at: list[float] = []
        vision_s = fill_s = None
        compiled_before = self.policy.compile_s
        n = self.settings.n
        copies = self.decoder_name == "hf" and self.settings.greedy and n > 1  # generate decodes each request once
        if self.decoder_name == "hf":
            tokens, ttft_s, t2, steps, syncs = self._generate_hf(self.on_device(prepared.groups[0].inputs), steps_at, t1,
                                                                 self._keys(prepared.requests))
            row_steps = len(tokens) // (n if copies else 1) * steps  # every row until the last one ends
        else:
            prefilled = self.prefill(prepared)
            t2, vision_s = now(self.device), prefilled.vision_s
            ttft_s = t2 - t1 - prefilled.compile_s
            self.policy.compile_s += prefilled.compile_s
            compiled_before += prefilled.compile_s  # the decode clock loses only the decode step's compile (below)
            decoded = self.decode(prefilled, steps_at)
            tokens, steps, syncs, row_steps = decoded.tokens, decoded.steps, decoded.syncs, decoded.row_steps
            fill_s = decoded.fill_s
            t2 += fill_s  # decoding starts once the caches are in the decode rows
        t3 = now(self.device)
        t2 += self.policy.compile_s - compiled_before  # a first use of a shape captures/compiles: not decoding
        if self.decoder_name == "vlmfast" and steps > 1:
            self.policy.observe(self.shape_key(self.last_shape), (t3 - t2) * 1000 / (steps - 1))
        done = {rid: [row] for rid, row in errors.items()}
        done.update({r.id: [self.result(r, prepared, tokens[i * n + k], k if n > 1 else None, copied=k > 0 and copies)
                            for k in range(n)]
                     for i, r in enumerate(prepared.requests)})
        worker_s, waited_s = (prefetched.worker_s, prefetched.waited_s) if prefetched else (0.0, 0.0)
        marks = [t2, *steps_at]
        timing = BatchTiming(
            # waiting can outlast the worker's own time (it started late): count the longer of the two
            size=len(prepared.requests), preprocess_s=t1 - t0 + max(worker_s, waited_s), ttft_s=ttft_s,
            decode_s=max(t3 - t2, 0.0), steps=steps,
            new_tokens=sum(row.n_new_tokens for r in prepared.requests for row in done[r.id] if not row.copied),
            step_times_s=tuple(b - a for a, b in zip(marks, marks[1:])) if self.record_steps else (),
            preprocess_exposed_s=t1 - t0 + waited_s, vision_s=vision_s, cache_fill_s=fill_s, syncs=syncs,
            row_steps=row_steps,
        )
        return [row for r in batch for row in done[r.id]], timing

    # -- phase 1: prepare ------------------------------------------------------------------------
    def prepare(self, batch: Sequence[Request], prefetched: Prefetched | None = None) -> Prepared:
        """Decoded images and model inputs (CPU tensors), one prefill group at a time, for the requests
        of ``batch`` whose images decode. Safe on a worker thread: nothing here touches the device."""
        if prefetched is not None and prefetched.prepared is not None:
            return prefetched.prepared
        images, failed = (prefetched.images, prefetched.failed) if prefetched else self.load_images(batch)
        ok = [r for r in batch if r.id not in failed]
        groups = []
        for a, b in self.prefill_groups(ok):
            inputs = self.build_inputs(ok[a:b], images)
            groups.append(PrefillGroup(a, b, inputs, self.positions(inputs)))
        counts = {}
        image_id = self.loaded.model.config.image_token_id
        for g in groups:
            ids, mask = g.inputs["input_ids"], g.inputs["attention_mask"]
            counts.update({r.id: (int(mask[i].sum()), int((ids[i] == image_id).sum()))
                           for i, r in enumerate(ok[g.start:g.end])})
        sizes = {r.id: [self.model_size(im) for im in images[r.id]] for r in ok}
        return Prepared(ok, groups, failed, sizes, counts)

    def prefill_groups(self, requests: Sequence[Request]) -> list[tuple[int, int]]:
        """Row ranges prefilled together: consecutive rows (a batch comes most expensive first) while
        rows × the widest prompt stays within ``max_batch_tokens``. Prefill is compute-bound and slows
        down once its activations outgrow the caches, while decode wants every row of the batch at
        once; ``--decoder hf`` prefills the whole batch inside generate."""
        if self.decoder_name == "hf" or not requests:
            return [(0, len(requests))]
        costs = [self.cost(r) for r in requests]
        groups, start = [], 0
        for i in range(1, len(requests) + 1):
            if i == len(requests) or (i - start + 1) * max(costs[start:i + 1]) > self.max_batch_tokens:
                groups.append((start, i))
                start = i
        return groups

    def build_inputs(self, batch: Sequence[Request], images: dict[str, list]):
        """Chat template + processor → left-padded CPU tensors (pinned on a CUDA machine, so the copy to
        the GPU in :meth:`on_device` does not wait)."""
        flat = [im for r in batch for im in images[r.id]]
        inputs = self.loaded.processor(
            text=[self.chat_text(r) for r in batch], images=flat or None, padding=True, return_tensors="pt",
            size={"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            do_resize=self.processor_resizes,  # Qwen's rule applied already (load_images); EasyR1's scaling: not yet
        )
        if self.on_cuda:
            for key, value in inputs.items():
                inputs[key] = value.pin_memory()
        return inputs

    def positions(self, inputs):
        """For vlmfast's decoder, the prompts' rotary positions (3, rows, length) from the model's
        ``get_rope_index``, on the CPU's tensors: host work (Python over every row and image: 17 ms of a
        32-image prefill on an H200 when done on the GPU's tensors) that a prefetch worker does while the
        device runs the previous batch. None for ``--decoder hf`` (generate makes its own)."""
        import torch

        from vlmfast.engines.hf.decode import rope_positions

        if self.decoder_name == "hf":
            return None
        with torch.inference_mode():
            positions = rope_positions(self.loaded.model, inputs)
        return positions.pin_memory() if self.on_cuda else positions

    def on_device(self, inputs):
        """A prefill group's tensors on the model's device (main thread only), pixels in the model's dtype."""
        model = self.loaded.model
        inputs = inputs.to(model.device, non_blocking=True)
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
        return inputs

    # -- phase 2: prefill ------------------------------------------------------------------------
    def prefill(self, prepared: Prepared) -> Prefilled:
        """The prompts (vision tower included) through the HF model with its own cache, one prefill
        group at a time; every row's first token chosen on the device. Rotary positions come from the
        model's ``get_rope_index`` and are passed in, so decode continues them exactly as ``generate``
        does (last prompt position + 1 + step)."""
        import torch

        from vlmfast.engines.hf.decode import Admission, rope_positions
        from vlmfast.engines.hf.sampling import penalize, seen_tokens, select
        from vlmfast.engines.hf.patch_embed import use_linear_patch_embed
        from vlmfast.engines.hf.vision_attention import use_merged_vision_attention
        from vlmfast.engines.hf.vision_mlp import use_aligned_vision_mlp

        model = self.loaded.model
        n = self.settings.n  # each prompt's n answers draw their first tokens apart, from the same logits
        groups, compile_s = [], 0.0
        with (torch.inference_mode(), vision_clock(model, self.device) as vision, use_merged_vision_attention(model) as merged,
              use_linear_patch_embed(model), use_aligned_vision_mlp(model, self.on_cuda)):
            for g in prepared.groups:
                inputs = self.on_device(g.inputs)
                pos = rope_positions(model, inputs) if g.positions is None else g.positions.to(model.device, non_blocking=True)
                out, compiling_s = self._prefill_forward(model, inputs, pos, vision, compile_vision=merged)
                compile_s += compiling_s
                keys = self._keys(prepared.requests[g.start:g.end])
                logits, seen = out.logits[:, -1, :].float(), None
                if self.penalty != 1.0:  # the prompt's tokens count from the first answer token on
                    seen = seen_tokens(inputs["input_ids"], inputs["attention_mask"], logits.shape[-1])
                    logits, seen = penalize(logits, seen, self.penalty), seen.repeat_interleave(n, 0)
                first = select(logits.repeat_interleave(n, 0), self.suppress(),
                               temperature=self.settings.temperature, top_p=self.settings.top_p, keys=keys)
                if seen is not None:
                    seen[torch.arange(first.shape[0], device=first.device), first] = True
                # transformers 5.24 names the output's cache `cache` (past_key_values is a warning alias)
                groups.append(Admission(first, pos[:, :, -1:].repeat_interleave(n, 1) + 1, inputs["attention_mask"].bool(),
                                        out["cache"] if "cache" in out else out.past_key_values, keys, n, seen))
        return Prefilled(groups, vision.seconds, compile_s)

    def _prefill_forward(self, model, inputs, positions, vision, compile_vision: bool = True):
        """One prefill group through the model, and the seconds of it that compiled vision blocks. The vision
        blocks run compiled where the decode step does and the vision attention runs merged
        (:func:`~vlmfast.engines.hf.vision_compile.run_compiled`); a compile that fails leaves them eager for
        the rest of the run, said in the notes."""
        from vlmfast.engines.hf.vision_compile import run_compiled

        forward = lambda: model(**inputs, position_ids=positions, use_cache=True, logits_to_keep=1)  # noqa: E731
        if not (self.policy.enabled and self.compile_vision and compile_vision):
            return forward(), 0.0
        out, compile_s, failed = run_compiled(model, forward, vision, self.device)
        if failed is not None:
            self.compile_vision = False
            self.policy.notes.append(f"vision blocks uncompiled: torch.compile failed ({failed})")
            return forward(), compile_s
        return out, compile_s

    # -- phase 3: decode -------------------------------------------------------------------------
    def decode(self, prefilled: Prefilled, steps_at: list[float] | None = None):
        """Every remaining token of every row (see :func:`vlmfast.engines.hf.decode.run_loop`): a static state per
        shape (CUDA graphs, ``torch.compile``) when enabled, the exact eager state otherwise."""
        import torch

        from vlmfast.engines.hf.decode import Decoded, run_loop

        s = self.settings
        if s.max_new_tokens == 1:  # prefill chose the only token: no decode state is built at all
            first = torch.cat([g.first for g in prefilled.groups])
            prefilled.groups = []
            return Decoded([[t] for t in first.tolist()], 1, 0, first.shape[0])
        rows = prefilled.rows
        width = max(g.key_valid.shape[1] for g in prefilled.groups)
        self.last_shape = (batch_bucket(rows) if self.cuda_graphs else rows, length_bucket(width + s.max_new_tokens))
        with torch.inference_mode():
            static = self.cuda_graphs or self.policy.enabled
            state = self._static_state() if static else self._new_state(rows, self.last_shape[1], static=False)
            state.reset()
            start, filling = 0, now(self.device)
            for g in prefilled.groups:
                state.admit(g, list(range(start, start + g.rows)), list(range(start, start + g.rows)))
                start += g.rows
            prefilled.groups = []  # the prompts' keys now live in the decode state's cache
            fill_s = now(self.device) - filling
            clock = StepTimes(self.device) if self.record_steps and steps_at is not None else None
            decoded = run_loop(state, stop_on_eos=not s.ignore_eos, sync_every=self.sync_every, on_step=clock)
            if clock is not None:
                steps_at.extend(clock.times())
            decoded.fill_s = fill_s
            return decoded

    def _new_state(self, rows: int, length: int, *, static: bool, forward=None):
        from vlmfast.engines.hf.decode import DecodeState, forward_static

        s = self.settings
        return DecodeState(self._decoder(), rows, length, s.max_new_tokens, static=static, eos_ids=self._eos(),
                           pad_id=self.loaded.pad_token_id, bias=self.suppress(), temperature=s.temperature,
                           top_p=s.top_p, forward=forward, attend_buckets=forward in (None, forward_static), penalty=self.penalty)

    # -- phase 4: results ------------------------------------------------------------------------
    def result(self, request: Request, prepared: Prepared, new_ids: list[int], sample: int | None = None,
               copied: bool = False) -> SampleResult:
        n_prompt, n_image = prepared.counts[request.id]
        family = self.loaded.family
        row = result_row(request, new_ids, eos_ids=self._eos(), tokenizer=self.loaded.processor.tokenizer,
                         n_prompt=n_prompt, n_image=n_image, model_sizes=prepared.model_sizes.get(request.id),
                         sample=sample, bbox_space=family.bbox_space if family else None, patch_size=self.patch_size)
        row.copied = copied  # a greedy answer given to another sample: written, not counted as generated
        return row

    # -- pieces ----------------------------------------------------------------------------------
    def decode_notes(self) -> list[str]:
        """What the decode loop decided on its own: packed CPU products (only the uncompiled step uses them),
        static steps attending by two matrix products."""
        from vlmfast.engines.hf.text_decoder import PRODUCTS_DECODE_ATTENTION

        text = self._text
        used = self.decoder_name == "vlmfast" and not self.policy.enabled
        notes = [text.pack_note] if text is not None and text.pack_note and used else []
        if any(state.attention == PRODUCTS_DECODE_ATTENTION for state in self._static.values()):
            notes.append("decode attention: two matrix products around a float32 softmax in the static decode steps "
                         "(VLMFAST_DECODE_ATTENTION=sdpa compares SDPA)")
        return notes

    def _eos(self) -> list[int]:
        return [] if self.settings.ignore_eos else list(self.loaded.eos_token_ids)

    def _decoder(self):
        if self._text is None:
            from vlmfast.engines.hf.decode import TextDecoder

            self._text = TextDecoder(self.loaded.model)
        return self._text

    def suppress(self):
        """The placeholder tokens' bias, the decode loop built with it (on a CPU it packs the weights)."""
        if self._bias is None:
            from vlmfast.engines.hf.decode import suppress_bias

            self._bias = suppress_bias(self._decoder().vocab, self.loaded.suppress_token_ids, self.loaded.model.device)
        return self._bias

    def _keys(self, requests: Sequence[Request]):
        from vlmfast.engines.hf.sampling import row_keys

        return None if self.settings.greedy else row_keys(self.seed, [r.id for r in requests], self.settings.n, self.device)
