"""The pixels the model gets: qwen-vl-utils' fetch_image wherever it works, the processor's size rule where it
does not (a long thin image under a small max_pixels)."""

import numpy as np
import pytest
from PIL import Image


@pytest.fixture(scope="module")
def processor(grpo_ckpt):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(grpo_ckpt))


@pytest.mark.parametrize("size,mode", [((517, 333), "RGB"), ((20, 10), "RGB"), ((120, 100), "RGBA"), ((90, 90), "P"),
                                        ((2100, 1500), "RGB")])
def test_same_pixels_as_fetch_image(processor, tmp_path, size, mode):
    from qwen_vl_utils import fetch_image

    from vlmfast.engines.prepare import Preparer
    from vlmfast.inputs.records import Request

    rng = np.random.default_rng(0)
    im = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).convert(mode)
    path = tmp_path / "x.png"
    im.save(path)
    prep = Preparer(processor, 100_000)
    ours = prep.load_images([Request(id="x", images=(str(path),), prompt="q")])[0]["x"][0]
    theirs = fetch_image({"image": str(path), "min_pixels": prep.min_pixels, "max_pixels": prep.max_pixels})
    assert ours.size == theirs.size and np.array_equal(np.asarray(ours), np.asarray(theirs))


def _strip(processor, tmp_path):
    """A 4000×25 image under --max-pixels 100352 (Qwen's rule clamps its height), loaded as the engines load it."""
    from vlmfast.engines.prepare import Preparer
    from vlmfast.inputs.records import Request

    path = tmp_path / "strip.png"
    Image.fromarray(np.zeros((25, 4000, 3), dtype=np.uint8)).save(path)
    prep = Preparer(processor, 100_000, max_pixels=100352)
    images, failed = prep.load_images([Request(id="s", images=(str(path),), prompt="q")])
    assert failed == {}
    return path, prep, images["s"]


def test_thin_image_under_small_max_pixels_gets_the_processors_size(processor, tmp_path):
    path, prep, images = _strip(processor, tmp_path)
    grid = processor.image_processor(images=images, do_resize=False,  # as the engine calls it
                                     return_tensors="pt")["image_grid_thw"].tolist()
    ref = processor.image_processor(images=[Image.open(path)], size={"shortest_edge": prep.min_pixels,
                                                                     "longest_edge": prep.max_pixels},
                                    return_tensors="pt")["image_grid_thw"].tolist()
    assert grid == ref
    assert prep.image_tokens(4000, 25) == grid[0][1] * grid[0][2] // 4


def _easyr1_process_image(path, min_pixels, max_pixels):
    """EasyR1's process_image (verl/utils/dataset.py), as its dataset and rollout call it, written out here as
    the reference: scaled into the bounds in the image's own mode, then RGB."""
    import math

    image = Image.open(path)
    image.load()
    if max_pixels is not None and image.width * image.height > max_pixels:
        f = math.sqrt(max_pixels / (image.width * image.height))
        image = image.resize((int(image.width * f), int(image.height * f)))
    if min_pixels is not None and image.width * image.height < min_pixels:
        f = math.sqrt(min_pixels / (image.width * image.height))
        image = image.resize((int(image.width * f), int(image.height * f)))
    return image if image.mode == "RGB" else image.convert("RGB")


@pytest.mark.parametrize("size,mode", [((400, 300), "RGB"), ((250, 180), "RGBA"), ((90, 70), "P"), ((3000, 2000), "RGB")])
def test_easyr1_rule_gives_the_pixels_easyr1_trained_on(processor, tmp_path, size, mode):
    """EasyR1's data.min_pixels / max_pixels are no smart_resize limits: the image is scaled into them, then the
    processor resizes it within its own. Qwen's rule with the same numbers gave a 400×300 image a 32×44 grid
    where EasyR1's gave 32×42; an RGBA image lost its alpha there, not laid on white."""
    from vlmfast.engines.prepare import Preparer
    from vlmfast.inputs.records import Request

    lo, hi = 262144, 4194304  # EasyR1's examples/config.yaml
    rng = np.random.default_rng(1)
    channels = 4 if mode == "RGBA" else 3
    im = Image.fromarray(rng.integers(0, 255, (size[1], size[0], channels), dtype=np.uint8))
    im = im.convert(mode) if mode != "RGBA" else im
    path = tmp_path / "x.png"
    im.save(path)
    prep = Preparer(processor, 100_000, min_pixels=lo, max_pixels=hi, resize_rule="easyr1")
    images, failed = prep.load_images([Request(id="x", images=(str(path),), prompt="q")])
    assert failed == {} and prep.processor_resizes
    ours = processor.image_processor(images=images["x"], do_resize=True, return_tensors="pt",
                                     size={"shortest_edge": prep.min_pixels, "longest_edge": prep.max_pixels})
    theirs = processor.image_processor(images=[_easyr1_process_image(path, lo, hi)], return_tensors="pt")
    assert ours["image_grid_thw"].tolist() == theirs["image_grid_thw"].tolist()
    assert np.array_equal(ours["pixel_values"].numpy(), theirs["pixel_values"].numpy())
    grid = theirs["image_grid_thw"][0].tolist()
    assert prep.image_tokens(*size) == grid[1] * grid[2] // prep.merge_size ** 2


def test_vllm_processor_kwargs_do_not_resize_a_clamped_image_again(processor, tmp_path):
    """Both engines give the model the same pixels: vLLM's processor call carries the HF engine's do_resize."""
    from vlmfast.engines.vllm.backend import VllmBackend

    _, prep, images = _strip(processor, tmp_path)
    hf = processor.image_processor(images=images, do_resize=prep.processor_resizes,  # the HF engine's call
                                   size={"shortest_edge": prep.min_pixels, "longest_edge": prep.max_pixels},
                                   return_tensors="pt")["image_grid_thw"].tolist()
    kwargs = VllmBackend.processor_kwargs(prep)  # what vLLM hands its HF processor with every prompt
    vllm = processor.image_processor(images=images, return_tensors="pt", **kwargs)["image_grid_thw"].tolist()
    assert hf == vllm == [[1, 2, 286]]


def test_easyr1_rule_records_the_size_the_model_saw(processor, tmp_path):
    from vlmfast.engines.prepare import Preparer
    from vlmfast.inputs.records import Request

    path = tmp_path / "photo.png"
    Image.new("RGB", (400, 300), (120, 30, 200)).save(path)
    prep = Preparer(processor, 100_000, min_pixels=262144, max_pixels=4194304, resize_rule="easyr1")
    images, _ = prep.load_images([Request(id="p", images=(str(path),), prompt="q")])
    grid = processor.image_processor(images=images["p"], do_resize=prep.processor_resizes,
                                     size={"shortest_edge": prep.min_pixels, "longest_edge": prep.max_pixels},
                                     return_tensors="pt")["image_grid_thw"].tolist()[0]
    assert prep.model_size(images["p"][0]) == [grid[2] * 14, grid[1] * 14] == [588, 448]  # EasyR1 scaled it to 591x443


def _keyed_png(tmp_path):
    """A PNG whose colour (10, 20, 30) is marked transparent (a tRNS chunk): PIL keeps the key beside the pixels."""
    pixels = np.full((56, 84, 3), 200, dtype=np.uint8)
    pixels[:28, :28] = (10, 20, 30)
    Image.fromarray(pixels).save(tmp_path / "key.png", transparency=(10, 20, 30))
    return tmp_path / "key.png"


def _rotated_jpeg(tmp_path):
    """A 56 × 28 JPEG whose EXIF says to show it turned a quarter (orientation 6), as phones save photos."""
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (56, 28), (90, 140, 60)).save(tmp_path / "phone.jpg", exif=exif)
    return tmp_path / "phone.jpg"


@pytest.mark.parametrize("rule", ["qwen", "easyr1"])
def test_the_engines_get_pixels_only_as_the_trainers_conversion_gives_them(processor, tmp_path, rule):
    """A PNG colour key and an EXIF orientation survive the RGB conversion and the resize as metadata, which
    vLLM (EXIF rotation; colour key from 0.33) and transformers (colour key from 5.21) act on and the trainers'
    PIL conversion does not. The engines get the pixels alone: the key colour stays, the photo is not turned,
    and the processor computes from them what it computes from a metadata-free copy."""
    from PIL import ImageOps

    from vlmfast.engines.prepare import Preparer
    from vlmfast.inputs.records import Request

    limits = dict(min_pixels=1024, max_pixels=4194304, resize_rule="easyr1") if rule == "easyr1" else {}
    prep = Preparer(processor, 100_000, **limits)
    key, photo = _keyed_png(tmp_path), _rotated_jpeg(tmp_path)
    images, failed = prep.load_images([Request(id="k", images=(str(key), str(photo)), prompt="q")])
    keyed, turned = images["k"]
    assert failed == {} and keyed.info == {} and turned.info == {}
    assert keyed.getpixel((0, 0)) == (10, 20, 30) and keyed.getpixel((keyed.width - 1, 0)) == (200, 200, 200)
    assert turned.width > turned.height and ImageOps.exif_transpose(turned).size == turned.size  # not turned
    for image in (keyed, turned):
        plain = Image.fromarray(np.asarray(image))
        ours, again = (processor.image_processor(images=[i], do_resize=prep.processor_resizes, return_tensors="pt")
                       for i in (image, plain))
        assert ours["pixel_values"].equal(again["pixel_values"])
