"""What the report says about the engine that ran, whichever it was: :class:`EngineFacts`, handed from a
:class:`~vlmfast.engines.contract.Backend` to :func:`vlmfast.run.summary.summarize` once generation is over."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineFacts:
    """What the report says about the engine, read once generation is over."""

    engine: str  # "hf" | "vllm"
    checkpoint: str
    load_s: float  # loading the model, or starting vLLM
    cache: dict  # where the checkpoint had the KV cache off, and that it is forced on
    device: str
    dtype: str
    attn: str
    decoder: str  # "vlmfast" | "hf" | "vllm"
    cuda_graphs: bool
    compiled: bool
    max_pixels: int | None
    max_pixels_capped: bool
    repetition_penalty: float | None = None  # the one applied to every answer (1.0: none; None: not known)
    compile_s: float = 0.0  # compiling and capturing decode steps, kept out of every clock
    oom_splits: int = 0  # batches halved after a CUDA out-of-memory error
    compile_cache: dict | None = None
    settings: dict | None = None  # vLLM's version and settings
    model_shape: object | None = None  # bandwidth.ModelShape, for decode bandwidth (None: not measurable here)
    device_name: str | None = None  # the CUDA device's name, for its datasheet bandwidth
    peak_mem_kind: str | None = None  # what peak memory measures, when not this process's own figure
    versions: dict = field(default_factory=dict)  # versions beyond vlmfast/torch/transformers (vLLM's)
    notes: list[str] = field(default_factory=list)  # what the engine decided or found on its own

    @classmethod
    def nothing_loaded(cls, options, found) -> EngineFacts:
        """A resume that finds every id already done loads no model: nothing to say about one."""
        from vlmfast.checkpoints.readers import saved_cache_report

        cache = {**saved_cache_report(found), "forced_on": False}
        return cls(engine=options.engine, checkpoint=found.source if found is not None else options.ckpt, load_s=0.0,
                   cache=cache, device="none", dtype="none", attn="none", decoder=options.decoder if options.engine == "hf"
                   else options.engine, cuda_graphs=False, compiled=False, max_pixels=options.max_pixels, max_pixels_capped=False,
                   notes=[])  # the runner says it: "nothing to do: … (the model was not loaded)"
