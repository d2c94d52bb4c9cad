"""The reference a speed-up is measured against: plain ``generate`` on the checkpoint exactly as saved
(cache off if its configs say so), with the same inputs and stop settings as vlmfast's engine."""

from __future__ import annotations

import copy

from vlmfast.engines.hf.engine import Engine


class AsSavedEngine(Engine):
    """Plain ``generate`` with the checkpoint's generation config exactly as saved (cache off if it
    says so): the same inputs and stop settings as vlmfast, but no ``use_cache`` argument."""

    def __init__(self, loaded, settings, saved_generation_config, **kwargs):
        self.saved_generation_config = saved_generation_config
        super().__init__(loaded, settings, decoder="hf", **kwargs)

    def generate_kwargs(self) -> dict:
        kwargs = super().generate_kwargs()
        kwargs.pop("use_cache")
        return kwargs

    def generate(self, inputs, clock=None, keys=None):
        model = self.loaded.model
        forced = model.generation_config
        model.generation_config = self.saved_generation_config
        try:
            return super().generate(inputs, clock, keys)
        finally:
            model.generation_config = forced


def saved_generation_config(loaded):
    """The GenerationConfig plain ``from_pretrained`` would have given (before vlmfast forced the cache)."""
    from transformers import GenerationConfig

    from vlmfast.checkpoints.readers import read_configs

    # an adapter dir has no config of its own: what plain generate honours is its base's (config_dir)
    _, generation = read_configs(loaded.config_dir)
    if generation is not None:
        return GenerationConfig.from_dict(copy.deepcopy(generation))
    return GenerationConfig.from_model_config(loaded.model.config)
