"""vlmfast: run GRPO-trained vision-language checkpoints at cached speed, batched, with honest timings.

Library API (imports are lazy so ``vlmfast --help`` stays instant)::

    import vlmfast
    loaded = vlmfast.load("out/checkpoint-300")          # cache forced on, left padding
    report = vlmfast.infer(vlmfast.InferOptions(ckpt="out", images=["a.png"], prompt="Count the dots."))
"""

__version__ = "0.2.0"

_EXPORTS = {
    "load": "checkpoint",
    "Loaded": "checkpoint",
    "Engine": "engine",
    "Scheduler": "scheduler",
    "GenerationSettings": "rows",
    "SampleResult": "rows",
    "parse_reasoning": "scoring",
    "Request": "inputs",
    "infer": "runner",
    "InferOptions": "options",
    "InferReport": "summary",
    "VlmfastError": "errors",
    "Family": "families",
    "family_for": "families",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'vlmfast' has no attribute {name!r}")
