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


def test_thin_image_under_small_max_pixels_gets_the_processors_size(processor, tmp_path):
    from vlmfast.engines.prepare import Preparer
    from vlmfast.inputs.records import Request

    path = tmp_path / "strip.png"
    Image.fromarray(np.zeros((25, 4000, 3), dtype=np.uint8)).save(path)
    prep = Preparer(processor, 100_000, max_pixels=100352)
    images, failed = prep.load_images([Request(id="s", images=(str(path),), prompt="q")])
    assert failed == {}
    grid = processor.image_processor(images=images["s"], do_resize=False,  # as the engine calls it
                                     return_tensors="pt")["image_grid_thw"].tolist()
    ref = processor.image_processor(images=[Image.open(path)], size={"shortest_edge": prep.min_pixels,
                                                                     "longest_edge": prep.max_pixels},
                                    return_tensors="pt")["image_grid_thw"].tolist()
    assert grid == ref
    assert prep.image_tokens(4000, 25) == grid[0][1] * grid[0][2] // 4
