"""How a request becomes what a model reads, the same for every engine: pixel limits, the chat template,
images decoded and resized by Qwen's rule, a request's prefill cost and whether it fits the context.

Both engines (:class:`vlmfast.engines.hf.engine.Engine` and :class:`vlmfast.engines.vllm.backend.VllmBackend`) are
:class:`Preparer`\\ s, so the same request gives the same prompt and the same image pixels on either.
"""

from __future__ import annotations

from collections.abc import Sequence

from vlmfast.engines.batching import easyr1_size, image_tokens
from vlmfast.errors import UsageError
from vlmfast.inputs.requests import Request

DEFAULT_MAX_PIXELS_CAP = 1280 * 28 * 28  # the real default (16384·28·28) OOMs on large images
# How the pixel limits a run is given resize an image. qwen: Qwen's smart_resize within them (qwen-vl-utils,
# ms-swift, VLM-R1, TRL). easyr1: EasyR1's data.min_pixels / max_pixels — its process_image first scales the
# image into them (int(side · factor), in the image's own mode, then RGB without the alpha), and the processor
# then resizes it within its own limits (the training's and the rollout's processor call).
RESIZE_RULES = ("qwen", "easyr1")


def pixels_only(image):
    """``image`` without the metadata PIL keeps beside its pixels (``info``: a PNG colour key, EXIF and XMP
    orientation, ICC profile), so that no library downstream changes the pixels prepared here. vLLM rotates
    an image by its EXIF orientation (``normalize_image``) and, from 0.33, lays a PNG colour key on white;
    transformers lays the key on white from 5.21; the HF engine hands the image to the processor as it is.
    The trainers' PIL conversion (qwen-vl-utils' ``to_rgb``, EasyR1's ``convert("RGB")``) does neither, so the
    pixels stay as that conversion gives them, for both engines, whichever versions are installed."""
    if not getattr(image, "info", None):
        return image
    out = image.copy()  # the caller's image keeps its own metadata
    out.info = {}
    return out


class Preparer:
    """Pixel limits (``min_pixels``, ``max_pixels``: the processor's own unless given, the maximum capped
    at 1280·28·28), Qwen's patch and merge sizes, and the request-level steps built on them. With
    ``resize_rule="easyr1"`` the given limits are EasyR1's pre-resize bounds (``bounds``) and ``min_pixels`` /
    ``max_pixels`` the processor's own, uncapped, the resize after them (as EasyR1's processor call)."""

    def __init__(self, processor, context_limit: int | None, *, min_pixels: int | None = None,
                 max_pixels: int | None = None, resize_rule: str = "qwen"):
        from vlmfast.errors import check_choice

        check_choice("--resize-rule", resize_rule, RESIZE_RULES)
        ip = processor.image_processor
        own_min, own_max = processor_pixel_limits(ip)
        self.resize_rule = resize_rule
        self.bounds = (min_pixels, max_pixels) if resize_rule == "easyr1" else None
        if self.bounds is not None:  # EasyR1's scaling, then the processor's own limits, as EasyR1's call (uncapped)
            min_pixels, max_pixels = None, own_max
        self.min_pixels = min_pixels if min_pixels is not None else own_min
        self.max_pixels = max_pixels if max_pixels is not None else min(own_max, DEFAULT_MAX_PIXELS_CAP)
        self.max_pixels_capped = max_pixels is None and own_max > DEFAULT_MAX_PIXELS_CAP
        if not 0 < self.min_pixels <= self.max_pixels:
            raise UsageError(f"pixel limits min {self.min_pixels} / max {self.max_pixels}: need 0 < min <= max",
                             hint="e.g. --min-pixels 3136 --max-pixels 1003520")
        self.patch_size = int(getattr(ip, "patch_size", 14))
        self.merge_size = int(getattr(ip, "merge_size", 2))
        self.chat_processor = processor
        self.context_limit = context_limit

    def image_tokens(self, width: int, height: int) -> int:
        if self.bounds is not None:
            width, height = easyr1_size(width, height, *self.bounds)
        return image_tokens(width, height, min_pixels=self.min_pixels, max_pixels=self.max_pixels,
                            patch_size=self.patch_size, merge_size=self.merge_size)

    def cost(self, request: Request, image_sizes: dict[str, tuple[int, int]] | None = None) -> int:
        """Prefill tokens this request will take (image tokens from the image headers' sizes)."""
        # rough prompt + template tokens: image tokens dominate; the sum orders batches, sizes prefill groups
        # and the auto batch size (the exact count comes from the processor, later)
        tokens = (len(request.prompt) + len(request.system or "")) // 3 + 16
        sizes = dict(zip(request.images, request.image_sizes)) if request.image_sizes else (image_sizes or {})
        return tokens + sum(self.image_tokens(*sizes.get(path, (448, 448))) for path in request.images)

    def chat_text(self, request: Request) -> str:
        """The chat template with one image part per image, then the prompt (and the system prompt)."""
        content = [{"type": "image", "image": p} for p in request.images] + [{"type": "text", "text": request.prompt}]
        system = [{"role": "system", "content": request.system}] if request.system else []
        return self.chat_processor.apply_chat_template(
            system + [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)

    def load_images(self, batch: Sequence[Request]) -> tuple[dict[str, list], dict[str, str]]:
        """Decode and resize every image (Qwen's rule, our pixel limits). A file that passed the
        header check but fails to decode (truncated data) fails only its own request. Images embedded in a
        dataset file are read from it now, this batch's only, and decoded in memory."""
        from vlmfast.inputs.datasets import load_images as embedded_images

        embedded = embedded_images(batch)
        images: dict[str, list] = {}
        failed: dict[str, str] = {}
        for r in batch:
            loaded = []
            for k, path in enumerate(r.images):
                try:
                    loaded.append(self.resized(embedded.get((r.id, k), path)))
                except Exception as exc:  # PIL raises many types for corrupt data
                    failed[r.id] = f"{path}: cannot decode image ({type(exc).__name__}: {exc})"
                    break
            else:
                images[r.id] = loaded
        return images, failed

    def resized(self, image):
        """One image (a path or a PIL image) in RGB at the size Qwen's rule gives it: qwen-vl-utils' ``fetch_image``
        (its RGB conversion, PIL's default resampling), with the size from the image processor's own
        ``smart_resize`` — qwen-vl-utils' leaves out the processor's floor of one block per side, so a long thin
        image under a small ``max_pixels`` came out 0 px high and failed as "cannot decode image". Its pixels
        only (:func:`pixels_only`)."""
        from PIL import Image
        from qwen_vl_utils.vision_process import to_rgb

        from vlmfast.engines.batching import smart_resize

        if self.bounds is not None:
            return self._easyr1_scaled(image)
        if isinstance(image, Image.Image):
            image = to_rgb(image)
        else:
            with Image.open(image) as opened:
                image = to_rgb(opened)
        factor = self.patch_size * self.merge_size
        height, width = smart_resize(image.height, image.width, factor=factor, min_pixels=self.min_pixels,
                                     max_pixels=self.max_pixels)
        return pixels_only(image.resize((width, height)))

    def _easyr1_scaled(self, image):
        """EasyR1's ``process_image``: scaled into its bounds in the image's own mode (PIL's default resampling),
        then RGB (the alpha dropped, not laid on white), its pixels only (:func:`pixels_only`). The processor
        resizes it after (``processor_resizes``)."""
        from PIL import Image

        if not isinstance(image, Image.Image):
            with Image.open(image) as opened:
                opened.load()
                image = opened.copy()
        width, height = easyr1_size(image.width, image.height, *self.bounds)
        if (width, height) != image.size:
            image = image.resize((width, height))
        return pixels_only(image if image.mode == "RGB" else image.convert("RGB"))

    def model_size(self, image) -> list[int]:
        """``[width, height]`` the model sees for an image :meth:`load_images` gave: its own size, or, where the
        processor resizes it after (``processor_resizes``: EasyR1's rule), the size the processor's rule gives it
        (what a box in resized coordinates and a reward's ``image_grid_thw`` refer to)."""
        if not self.processor_resizes:
            return list(image.size)
        from vlmfast.engines.batching import smart_resize

        height, width = smart_resize(image.height, image.width, factor=self.patch_size * self.merge_size,
                                     min_pixels=self.min_pixels, max_pixels=self.max_pixels)
        return [width, height]

    def processor_kwargs(self) -> dict:
        """vLLM's ``mm_processor_kwargs`` for every prompt: the pixel limits, and ``do_resize`` as the HF engine's
        processor call has it — Qwen's rule is applied already (:meth:`load_images`) and is not idempotent where a
        side is clamped (4000x25 under 100352 px: 28x4004 once, 28x3780 again); after EasyR1's scaling it resizes."""
        return {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels, "do_resize": self.processor_resizes}

    @property
    def processor_resizes(self) -> bool:
        """Whether the processor resizes the images :meth:`load_images` gives it: after EasyR1's scaling, as
        EasyR1's processor call does; never after Qwen's rule, which is not idempotent where a side is clamped."""
        return self.bounds is not None

    def context_problems(self, requests: Sequence[Request], image_sizes: dict) -> dict[str, str]:
        """Requests whose prompt (text + image tokens) leaves no room in the model's context, by id; a
        UsageError when ``--max-new-tokens`` alone is more than the context (an engine sizes its cache by it); a
        note in the engine's ``notes`` for prompts that leave room for fewer than ``--max-new-tokens``."""
        if not self.context_limit:
            return {}
        wanted = getattr(getattr(self, "settings", None), "max_new_tokens", 0)
        if wanted > self.context_limit:
            from vlmfast.errors import UsageError

            raise UsageError(f"--max-new-tokens {wanted} is more than the model's whole context ({self.context_limit} "
                             "tokens, the prompt included)",
                             hint=f"give at most the context less the prompt, e.g. --max-new-tokens {self.context_limit // 2}")
        tokenizer = self.chat_processor.tokenizer
        problems, past = {}, []
        for r in requests:
            n = len(tokenizer(self.chat_text(r), add_special_tokens=False)["input_ids"])
            for path in r.images:  # the template holds one placeholder per image; the processor expands it
                n += self.image_tokens(*image_sizes.get(path, (448, 448))) - 1
            if n >= self.context_limit:
                problems[r.id] = f"prompt is {n} tokens (text + images); the model's context is {self.context_limit}"
            elif n + wanted > self.context_limit:
                past.append(r.id)
        notes = getattr(self, "notes", None)  # the engine's notes reach the report
        if past and isinstance(notes, list):
            said = (f"{len(past)} request(s) (e.g. {past[0]}): the prompt plus --max-new-tokens {wanted} passes the "
                    f"model's context ({self.context_limit} tokens): vLLM stops such an answer at the context, "
                    "vlmfast's engine decodes on past it as plain generate does")
            notes += [said] * (said not in notes)  # a sweep asks once per checkpoint: said once
        return problems


def processor_pixel_limits(image_processor) -> tuple[int, int]:
    """(min_pixels, max_pixels) of a Qwen2-VL image processor, across transformers versions."""
    return pixel_limits(getattr(image_processor, "size", None) or {}, getattr(image_processor, "min_pixels", None),
                        getattr(image_processor, "max_pixels", None))


def pixel_limits(size, min_pixels=None, max_pixels=None) -> tuple[int, int]:
    """(min, max) pixels from an image processor's settings — a loaded one's or its saved config's —
    whichever transformers wrote them: ``size``'s shortest/longest edge, then the older ``min_pixels`` /
    ``max_pixels``, then Qwen's defaults (56·56, 16384·28·28)."""
    get = size.get if isinstance(size, dict) else lambda k, d=None: getattr(size, k, d)
    lo = get("shortest_edge") or min_pixels or 56 * 56
    hi = get("longest_edge") or max_pixels or 16384 * 28 * 28
    return int(lo), int(hi)
