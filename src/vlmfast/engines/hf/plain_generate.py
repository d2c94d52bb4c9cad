"""The reference path: plain ``model.generate`` with the cache on (``--decoder hf``).

vlmfast's own decode loop is held to it token for token, and families the loop does not know run
through it. Mixed into :class:`~vlmfast.engines.hf.engine.Engine`, whose settings, model and stop list
it uses.
"""

from __future__ import annotations

from vlmfast.engines.generation_config import UNAPPLIED
from vlmfast.timing import StepClock, now


class MaskedPenalty:
    """The repetition penalty as a logits processor over each row's own tokens — its prompt without the
    batch's left padding, and its answer so far — as vlmfast's loop applies it. transformers 4.57's own
    processor counts the padding as seen (the pad token is an EOS id), so a padded row's tokens would depend
    on the batch; generate is then given none of its own."""

    def __init__(self, prompt_mask, penalty: float):
        self.prompt_mask, self.penalty = prompt_mask, penalty

    def __call__(self, input_ids, scores):
        import torch

        from vlmfast.engines.hf.sampling import penalize, seen_tokens

        answer = input_ids.shape[1] - self.prompt_mask.shape[1]
        mask = torch.cat([self.prompt_mask, self.prompt_mask.new_ones(input_ids.shape[0], answer)], dim=1)
        return penalize(scores, seen_tokens(input_ids, mask, scores.shape[-1]), self.penalty)


class KeyedDraw:
    """A logits processor that makes ``generate``'s draws vlmfast's own: each row's token is chosen by
    :func:`~vlmfast.engines.hf.sampling.select` (temperature, top-p, the race on the row's own noise) from
    its key — (seed, request id, sample), :func:`~vlmfast.engines.rows.draw_key` — and the step, and
    returned as the only token left (0 there, -inf elsewhere): generate's own sampling, which draws from
    torch's global generator and so depends on the batch, has nothing else to pick. An answer is then the
    same whatever the batch, the order or a resume, and the same as vlmfast's loop draws for it."""

    def __init__(self, keys, prompt_len: int, temperature: float, top_p: float):
        self.keys, self.prompt_len, self.temperature, self.top_p = keys, prompt_len, temperature, top_p
        self.hashed = None

    def __call__(self, input_ids, scores):
        import torch

        from vlmfast.engines.hf.sampling import select, token_hashes

        if self.hashed is None:
            self.hashed = token_hashes(scores.shape[-1], scores.device)
        step = input_ids.shape[1] - self.prompt_len  # the answer's token being chosen: 0 is the first
        chosen = select(scores.float(), 0.0, temperature=self.temperature, top_p=self.top_p, keys=self.keys, step=step,
                        hashed_tokens=self.hashed)
        return torch.full_like(scores, float("-inf")).scatter_(1, chosen[:, None], 0.0)


class PlainGenerate:
    def generate(self, inputs, clock=None, keys=None):
        """``model.generate`` with the cache on: vlmfast's settings over the checkpoint's generation
        config (``no_repeat_ngram_size`` etc. kept; the repetition penalty the engine's), our stop list, suppressed vision placeholders. Sampling:
        ``keys`` (each decode row's, :meth:`_keys`) draw every token (:class:`KeyedDraw`)."""
        import torch
        from transformers import LogitsProcessorList

        from vlmfast.engines.hf.patch_embed import use_linear_patch_embed
        from vlmfast.engines.hf.vision_attention import use_merged_vision_attention
        from vlmfast.engines.hf.vision_mlp import use_aligned_vision_mlp

        kwargs = self.generate_kwargs()
        processors = [] if clock is None else [clock]
        if self.penalty != 1.0:  # before a draw, as generate orders its own processors before sampling
            mask = inputs["attention_mask"]
            expand = kwargs.get("num_return_sequences") or 1  # generate repeats each prompt row as many times
            processors.append(MaskedPenalty(mask.repeat_interleave(expand, 0) if expand > 1 else mask, self.penalty))
        if keys is not None:
            processors.append(KeyedDraw(keys, inputs["input_ids"].shape[1], self.settings.temperature, self.settings.top_p))
        if processors:
            kwargs["logits_processor"] = LogitsProcessorList(processors)
        model = self.loaded.model
        # the same vision numerics as vlmfast's prefill
        with (torch.inference_mode(), use_merged_vision_attention(model), use_linear_patch_embed(model),
              use_aligned_vision_mlp(model, self.on_cuda)):
            return self.loaded.model.generate(**inputs, **kwargs)

    def generate_kwargs(self) -> dict:
        s, loaded = self.settings, self.loaded
        kwargs = dict(
            use_cache=True, max_new_tokens=s.max_new_tokens, min_new_tokens=None, max_length=None,
            pad_token_id=loaded.pad_token_id, eos_token_id=self._eos() or None,
            suppress_tokens=list(loaded.suppress_token_ids) or None,
            repetition_penalty=1.0,  # none of generate's own: MaskedPenalty applies the checkpoint's, or --repetition-penalty
            # one answer per row, no beams, no stop strings (the EOS list), no BOS (the prompt is given), and only
            # --temperature/--top-p sampling: saved values of these that generate refuses are not applied either
            num_beams=1, stop_strings=None, bos_token_id=None, min_p=None, typical_p=None,
        )
        saved = loaded.model.generation_config  # its processors' settings generate applies; a string raises there
        kwargs.update({key: off for key, off in UNAPPLIED.items() if isinstance(getattr(saved, key, None), str)})
        if s.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None, num_return_sequences=1)
        else:  # n answers per request: generate expands each prompt n times itself
            kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=None, num_return_sequences=s.n)
        return kwargs

    def _generate_hf(self, inputs, steps_at, t1, keys=None):
        """``generate`` timed from inside: a logits processor reads the clock as each token's logits
        are ready (the only window into generate's loop)."""
        clock = StepClock(self.device, self.record_steps)
        output = self.generate(inputs, clock, keys)
        end = now(self.device)
        prompt_len = inputs["input_ids"].shape[1]
        first = clock.times[0] if clock.times else end
        steps_at.extend(clock.times[1:])
        tokens = output[:, prompt_len:].tolist()
        if self.settings.greedy and self.settings.n > 1:  # greedy answers are all alike: decoded once, n rows
            tokens = [row for row in tokens for _ in range(self.settings.n)]
        return tokens, first - t1, first, output.shape[1] - prompt_len, 0
