"""The model families vlmfast knows, in one table: ``model_type`` → :class:`Family`.

Everything that differs between families is read from here — which decode loop runs them, how their
boxes are measured, their special tokens and the EOS list a base model ships, the vision placeholders,
the processor classes and the transformers versions that have them. No other module branches on
``model_type``. A model type not in the table is no error: such a model runs through plain
``generate`` (``--decoder hf``) with a note saying that vlmfast has not tested its family.

Pure data, no torch or transformers: doctor and fix read it without importing either.
"""

from __future__ import annotations

from dataclasses import dataclass

LOOPS = ("own", "own-eager", "hf")
BOX_SPACES = ("resized", "rel1000")

# Qwen's special tokens in their vocabulary order; every Qwen-VL family puts them at consecutive ids
# from its ``real_first_special`` (151643 for Qwen2/2.5/3-VL, 248044 for Qwen3.5).
QWEN_SPECIAL = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
QWEN_VISION = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
QWEN_EOS = ("<|im_end|>", "<|endoftext|>")  # generation_config.json of the released Instruct models
CHAT_STOP = "<|im_end|>"  # ends a chat turn; the default for a model type the table does not know


@dataclass(frozen=True)
class Family:
    """One model family: what running, checking and scoring it needs to know.

    ``loop``: ``"own"`` — vlmfast's decode loop, CUDA graphs and compile allowed where the model's step has
    fixed shapes (an MoE's experts: :func:`vlmfast.engines.hf.moe.dynamic_experts`); ``"own-eager"`` — the
    loop without graphs or compile (data-dependent shapes in the step);
    ``"hf"`` — plain ``generate``. ``bbox_space``: ``"resized"`` — absolute pixels of the image the model
    saw (Qwen2.5-VL); ``"rel1000"`` — 0–1000 relative to the image (Qwen2-VL, Qwen3-VL, Qwen3.5).
    """

    key: str  # build_checkpoint(family=...) and the CLI's --family
    name: str  # how reports name it
    model_types: tuple[str, ...]  # config.json model_type values
    model_class: str
    processor_class: str
    image_processor_class: str
    video_processor_class: str
    loop: str
    bbox_space: str
    since: str  # the first transformers release with model_class
    real_first_special: int  # id of special_tokens[0] in the released vocabulary
    real_vocab: int  # embedding rows of the released models (the smallest size)
    special_tokens: tuple[str, ...] = QWEN_SPECIAL
    eos_tokens: tuple[str, ...] = QWEN_EOS
    chat_stop: str = CHAT_STOP
    vision_tokens: tuple[str, ...] = QWEN_VISION
    tokenizer_class: str = "Qwen2Tokenizer"  # what the released tokenizer_config.json names
    vocabulary: str = "qwen2"  # "qwen2" (Qwen2 to Qwen3-VL) | "qwen3_5": a tokenizer of its own, other ids
    patch_size: int = 14  # vision patch side in pixels; an image token covers (patch * 2)² pixels
    linear_attention: bool = False  # Gated DeltaNet layers keep conv + recurrent states, not keys/values
    moe: bool = False

    @property
    def graphs(self) -> bool:
        """Whether the decode step may be captured in a CUDA graph or compiled."""
        return self.loop == "own"

    def real_token_id(self, token: str, vocab_size: int | None) -> int | None:
        """The id ``token`` has in the released vocabulary, when a checkpoint's ``vocab_size`` is that
        vocabulary's (fine-tunes add tokens at the end, never before the special ones); else None."""
        if token not in self.special_tokens or not vocab_size or vocab_size < self.real_vocab:
            return None
        return self.real_first_special + self.special_tokens.index(token)


FAMILIES: tuple[Family, ...] = (
    Family("qwen2_vl", "Qwen2-VL", ("qwen2_vl",), "Qwen2VLForConditionalGeneration", "Qwen2VLProcessor",
           "Qwen2VLImageProcessor", "Qwen2VLVideoProcessor", loop="own", bbox_space="rel1000", since="4.45",
           real_first_special=151643, real_vocab=151936),
    Family("qwen2_5_vl", "Qwen2.5-VL", ("qwen2_5_vl",), "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor",
           "Qwen2VLImageProcessor", "Qwen2VLVideoProcessor", loop="own", bbox_space="resized", since="4.49",
           real_first_special=151643, real_vocab=151936),
    Family("qwen3_vl", "Qwen3-VL", ("qwen3_vl",), "Qwen3VLForConditionalGeneration", "Qwen3VLProcessor",
           "Qwen2VLImageProcessor", "Qwen3VLVideoProcessor", loop="own", bbox_space="rel1000", since="4.57",
           real_first_special=151643, real_vocab=151936, patch_size=16),
    # MoE families: whether their experts have fixed shapes depends on the transformers and the device
    # (vlmfast.engines.hf.moe.dynamic_experts); where they do not, the engine decodes without graphs.
    Family("qwen3_vl_moe", "Qwen3-VL-MoE", ("qwen3_vl_moe",), "Qwen3VLMoeForConditionalGeneration", "Qwen3VLProcessor",
           "Qwen2VLImageProcessor", "Qwen3VLVideoProcessor", loop="own", bbox_space="rel1000", since="4.57",
           real_first_special=151643, real_vocab=151936, patch_size=16, moe=True),
    Family("qwen3_5", "Qwen3.5", ("qwen3_5",), "Qwen3_5ForConditionalGeneration", "Qwen3VLProcessor",
           "Qwen2VLImageProcessor", "Qwen3VLVideoProcessor", loop="own", bbox_space="rel1000", since="5",
           real_first_special=248044, real_vocab=248320, patch_size=16, linear_attention=True, vocabulary="qwen3_5"),
    Family("qwen3_5_moe", "Qwen3.5-MoE", ("qwen3_5_moe",), "Qwen3_5MoeForConditionalGeneration", "Qwen3VLProcessor",
           "Qwen2VLImageProcessor", "Qwen3VLVideoProcessor", loop="own", bbox_space="rel1000", since="5",
           real_first_special=248044, real_vocab=248320, patch_size=16, linear_attention=True, moe=True,
           vocabulary="qwen3_5"),
)
BY_KEY = {f.key: f for f in FAMILIES}
_BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def family_for(model_type: str | None) -> Family | None:
    """The family of a config.json ``model_type``; None for a type vlmfast does not know."""
    return _BY_MODEL_TYPE.get(model_type) if model_type else None


def family_of(config: dict) -> Family | None:
    """The family of a raw config.json dict (see :func:`family_for`)."""
    model_type = config.get("model_type")
    return family_for(model_type if isinstance(model_type, str) else None)


def family_by_key(key: str) -> Family:
    """The family named ``key`` (``qwen2_5_vl`` …); a UsageError listing the valid keys otherwise."""
    from vlmfast.errors import check_choice

    check_choice("--family", key, tuple(BY_KEY))
    return BY_KEY[key]


def untested_note(model_type: str | None) -> str:
    """What the report says about a model whose family the table does not hold."""
    known = ", ".join(t for f in FAMILIES for t in f.model_types)
    return (f"model_type {model_type!r} is a family vlmfast has not tested (tested: {known}); "
            "it decodes with plain generate (--decoder hf)")


def decoder_for(family: Family | None, requested: str) -> tuple[str, str | None]:
    """The decoder to use for ``family`` when ``requested`` (``"vlmfast"`` or ``"hf"``) was asked for,
    and a note when it differs: a family the table does not know, or one whose loop is ``"hf"``, runs
    plain ``generate``."""
    if requested != "vlmfast":
        return requested, None
    if family is None:
        return "hf", "an untested model family decodes with plain generate (--decoder hf)"
    if family.loop == "hf":
        return "hf", f"{family.name} decodes with plain generate (--decoder hf): vlmfast's loop does not run it"
    return requested, None


def decode_choice(family: Family | None, decoder: str, compile, cuda_graphs,
                  dynamic: str | None = None) -> tuple[str, object, object, list[str]]:
    """(decoder, compile, cuda_graphs, notes) for ``family`` when these were asked for: a family the loop
    does not run decodes with plain generate; a step without fixed shapes decodes without CUDA graphs or
    compile — a family's (loop ``own-eager``), or this model's on this device (``dynamic``: why, e.g. an
    MoE's experts as this transformers runs them). Each change is said in the notes."""
    decoder, why = decoder_for(family, decoder)
    fixed_shapes = (family is None or family.graphs) and dynamic is None
    if not why and fixed_shapes:
        return decoder, compile, cuda_graphs, []
    asked = [flag for flag, on in (("--compile", compile), ("--cuda-graphs", cuda_graphs)) if on]
    name = family.name if family is not None else "this model"
    notes = [why] if why else [f"{name} decodes without CUDA graphs or compile "
                               f"({dynamic or 'its decode step has data-dependent shapes'})"]
    return decoder, False, False, notes + ([f"{' and '.join(asked)} not applied"] if asked else [])


def classes_in_every_version(oldest: str = "4.57") -> frozenset[str]:
    """Processor, image/video processor and tokenizer class names of the families that every supported
    transformers (``oldest`` on) exports: doctor checks these without importing transformers."""
    def version(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("."))

    return frozenset(name for f in FAMILIES if version(f.since) <= version(oldest)
                     for name in (f.processor_class, f.image_processor_class, f.video_processor_class,
                                  f.tokenizer_class))


# Tensor names (without the ``model.`` / ``language_model.`` wrappers) that only a family's saves hold,
# all of which a save must have to be that family's: the vision MLP's layer names tell Qwen2-VL (fc1),
# Qwen2.5-VL (gated: gate_proj) and the Qwen3 line (linear_fc1) apart; DeepStack mergers mark Qwen3-VL,
# Gated DeltaNet layers Qwen3.5, expert tensors (fused or per expert) the MoE models.
_QWEN3_VISION = r"^visual\.blocks\.\d+\.mlp\.linear_fc1\."
_EXPERTS = r"^layers\.\d+\.mlp\.experts\."
TENSOR_MARKS: dict[str, tuple[str, ...]] = {
    "qwen2_vl": (r"^visual\.blocks\.\d+\.mlp\.fc1\.",),
    "qwen2_5_vl": (r"^visual\.blocks\.\d+\.mlp\.gate_proj\.",),
    "qwen3_vl": (_QWEN3_VISION, r"^visual\.deepstack_merger_list\."),
    "qwen3_vl_moe": (_QWEN3_VISION, r"^visual\.deepstack_merger_list\.", _EXPERTS),
    "qwen3_5": (_QWEN3_VISION, r"^layers\.\d+\.linear_attn\."),
    "qwen3_5_moe": (_QWEN3_VISION, r"^layers\.\d+\.linear_attn\.", _EXPERTS),
}


def family_of_tensors(names) -> Family | None:
    """The family whose saves hold tensors of these names (canonical: without the ``model.`` and
    ``language_model.`` wrappers; :data:`TENSOR_MARKS`): of the families all of whose marks some name
    carries, the one with the most. None when no family's marks are all there, or two fit equally."""
    import re

    names = list(names)
    fits = [(len(marks), key) for key, marks in TENSOR_MARKS.items()
            if all(any(re.search(m, n) for n in names) for m in marks)]
    if not fits:
        return None
    fits.sort(reverse=True)
    if len(fits) > 1 and fits[0][0] == fits[1][0]:
        return None
    return BY_KEY[fits[0][1]]


def version_tuple(text: str) -> tuple[int, ...]:
    """"4.57.6" → (4, 57): a release's major and minor."""
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def installed_transformers() -> tuple[int, ...] | None:
    """The installed transformers' (major, minor), read from its metadata (without importing it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version_tuple(version("transformers"))
    except PackageNotFoundError:
        return None
