"""The reference path: plain ``model.generate`` with the cache on (``--decoder hf``).

vlmfast's own decode loop is held to it token for token, and families the loop does not know run
through it. Mixed into :class:`~vlmfast.engines.hf.engine.Engine`, whose settings, model and stop list
it uses.
"""

from __future__ import annotations

from vlmfast.timing import StepClock, now


class PlainGenerate:
    def generate(self, inputs, clock=None):
        """``model.generate`` with the cache on: vlmfast's settings over the checkpoint's generation
        config (repetition penalty etc. kept), our stop list, suppressed vision placeholders."""
        import torch
        from transformers import LogitsProcessorList

        from vlmfast.engines.hf.patch_embed import use_linear_patch_embed
        from vlmfast.engines.hf.vision_attention import use_merged_vision_attention

        kwargs = self.generate_kwargs()
        if clock is not None:
            kwargs["logits_processor"] = LogitsProcessorList([clock])
        model = self.loaded.model
        # the same vision numerics as vlmfast's prefill
        with torch.inference_mode(), use_merged_vision_attention(model), use_linear_patch_embed(model):
            return self.loaded.model.generate(**inputs, **kwargs)

    def generate_kwargs(self) -> dict:
        s, loaded = self.settings, self.loaded
        kwargs = dict(
            use_cache=True, max_new_tokens=s.max_new_tokens, min_new_tokens=None, max_length=None,
            pad_token_id=loaded.pad_token_id, eos_token_id=self._eos() or None,
            suppress_tokens=list(loaded.suppress_token_ids) or None,
        )
        if s.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:  # n answers per request: generate expands each prompt n times itself
            kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=None, num_return_sequences=s.n)
        return kwargs

    def _generate_hf(self, inputs, steps_at, t1):
        """``generate`` timed from inside: a logits processor reads the clock as each token's logits
        are ready (the only window into generate's loop)."""
        clock = StepClock(self.device, self.record_steps)
        output = self.generate(inputs, clock)
        end = now(self.device)
        prompt_len = inputs["input_ids"].shape[1]
        first = clock.times[0] if clock.times else end
        steps_at.extend(clock.times[1:])
        tokens = output[:, prompt_len:].tolist()
        if self.settings.greedy and self.settings.n > 1:  # greedy answers are all alike: decoded once, n rows
            tokens = [row for row in tokens for _ in range(self.settings.n)]
        return tokens, first - t1, first, output.shape[1] - prompt_len, 0
