"""A VLMEvalKit TSV's images reach the model with the pixels VLMEvalKit gives them: its decoder converts
RGBA, LA and palette images to RGB (the alpha dropped) before the model's loader reads the file it writes."""

import base64
import csv
import io

from PIL import Image


def _tsv(tmp_path, image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    path = tmp_path / "set.tsv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerow(["index", "question", "A", "B", "answer", "image"])
        writer.writerow(["1", "Which colour?", "red", "black", "A", base64.b64encode(buffer.getvalue()).decode()])
    return str(path)


def test_a_transparent_pixel_is_its_colour_without_the_alpha_not_white(tmp_path):
    from vlmfast.inputs.datasets import load_images
    from vlmfast.inputs.requests import read_manifest

    image = Image.new("RGBA", (56, 56), (0, 0, 0, 0))  # transparent black around
    image.paste((255, 0, 0, 255), (14, 14, 42, 42))  # an opaque red square
    items, _ = read_manifest(_tsv(tmp_path, image), None)
    decoded = load_images(items)[("1", 0)]
    from qwen_vl_utils.vision_process import to_rgb  # what the engines' resize applies next

    seen = to_rgb(decoded)
    assert seen.getpixel((0, 0)) == (0, 0, 0) and seen.getpixel((28, 28)) == (255, 0, 0)

