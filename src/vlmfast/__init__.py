"""vlmfast: run GRPO-trained vision-language checkpoints at cached speed, batched, with honest timings.

Library API (imports are lazy so ``vlmfast --help`` stays instant)::

    import vlmfast
    loaded = vlmfast.load("out/checkpoint-300")          # cache forced on, left padding
    report = vlmfast.infer(vlmfast.InferOptions(ckpt="out", images=["a.png"], prompt="Count the dots."))
"""

__version__ = "0.18.12"

_EXPORTS = {
    "load": "checkpoints.load",
    "Loaded": "checkpoints.load",
    "Engine": "engines.hf.engine",
    "Scheduler": "engines.hf.scheduler",
    "GenerationSettings": "engines.rows",
    "SampleResult": "engines.rows",
    "parse_reasoning": "evaluation.scoring",
    "Request": "inputs.requests",
    "infer": "run.runner",
    "InferOptions": "run.options",
    "InferReport": "run.summary",
    "sweep": "run.sweep",
    "SweepOptions": "run.sweep_options",
    "VlmfastError": "errors",
    "Family": "checkpoints.families",
    "family_for": "checkpoints.families",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'vlmfast' has no attribute {name!r}")


def __dir__():
    """The lazy exports too, so ``dir(vlmfast)`` and completion show the API."""
    return sorted(set(globals()) | set(__all__))
