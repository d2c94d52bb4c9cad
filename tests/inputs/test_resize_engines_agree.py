"""Both engines give the model the same pixels and record the size it saw: vLLM's processor call carries the HF
engine's do_resize (Qwen's rule is not idempotent where a side is clamped), and under --resize-rule easyr1 the
rows' model_image_sizes are the processor's resized size, not EasyR1's pre-scaled one."""

import numpy as np
import pytest
from PIL import Image


@pytest.fixture(scope="module")
def processor(grpo_ckpt):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(grpo_ckpt))


def test_vllm_processor_kwargs_do_not_resize_a_clamped_image_again(processor, tmp_path):
    from vlmfast.engines.prepare import Preparer
    from vlmfast.engines.vllm.backend import VllmBackend
    from vlmfast.inputs.records import Request

    path = tmp_path / "strip.png"
    Image.fromarray(np.zeros((25, 4000, 3), dtype=np.uint8)).save(path)
    prep = Preparer(processor, 100_000, max_pixels=100352)
    images, failed = prep.load_images([Request(id="s", images=(str(path),), prompt="q")])
    assert failed == {}
    hf = processor.image_processor(images=images["s"], do_resize=prep.processor_resizes,  # the HF engine's call
                                   size={"shortest_edge": prep.min_pixels, "longest_edge": prep.max_pixels},
                                   return_tensors="pt")["image_grid_thw"].tolist()
    kwargs = VllmBackend.processor_kwargs(prep)  # what vLLM hands its HF processor with every prompt
    vllm = processor.image_processor(images=images["s"], return_tensors="pt", **kwargs)["image_grid_thw"].tolist()
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
