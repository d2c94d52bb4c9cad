"""benchmarks/figures/report.png: a screenshot of report.html from a real 4-checkpoint sweep of tiny random checkpoints (base
and steps 100, 200, 300) on a manifest of three number rows and one box row, opened on the box row. Tiny
random checkpoints answer noise, so step 200's answer to the box row is replaced by a box (scored as a
run scores it, then the sweep rerun to summarize the step's rows again) to show a predicted box drawn beside
the true one. Needs Chromium (see tests/browser.py).
Run: PYTHONPATH=src .venv/bin/python scripts/report_screenshot.py [OUT.png]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main(out: Path) -> None:
    from browser import screenshot
    from PIL import Image, ImageDraw

    from vlmfast.checkpoints.tiny import build_checkpoint, make_images
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.evaluation.scoring import score_row
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions, sweep
    from vlmfast.run.sweep_page import write_sweep_dir

    out = out.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # relative paths: the page names runs/tiny-grpo, not a temporary directory
        images = make_images("images", n=3, sizes=[(320, 240)])
        box_image = Path("images/box.png")
        picture = Image.new("RGB", (320, 240), (214, 226, 240))
        ImageDraw.Draw(picture).rectangle((60, 70, 210, 170), fill=(206, 52, 44))
        ImageDraw.Draw(picture).ellipse((230, 30, 290, 90), fill=(60, 120, 200))
        picture.save(box_image)
        for step, seed in ((100, 1), (200, 2), (300, 3)):
            build_checkpoint(Path("runs/tiny-grpo") / f"checkpoint-{step}", preset="tiny", like="grpo", seed=seed)
        base = build_checkpoint(Path("base"), preset="tiny", like="base", seed=0)
        lines = [{"id": f"count-{i}", "image": str(p), "prompt": "How many shapes are there?", "solution": str(i + 2)}
                 for i, p in enumerate(images)]
        lines.append({"id": "box", "image": str(box_image), "prompt": "Where is the red rectangle? Answer [x1, y1, x2, y2].",
                      "solution": [60, 70, 210, 170], "scorer": "bbox"})
        Path("eval.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        truth = {line["id"]: line["solution"] for line in lines}
        infer = InferOptions(ckpt="runs/tiny-grpo", manifest="eval.jsonl", device="cpu",
                             generation=GenerationSettings(max_new_tokens=8))
        options = SweepOptions(run_dir="runs/tiny-grpo", out_dir="sweep", infer=infer, base=str(base))
        sweep(options)
        step_file = Path("sweep/step-200.jsonl")
        rows = [json.loads(line) for line in step_file.read_text().splitlines()]
        for row in rows:
            if row["id"] == "box":
                row.update(answer="[66, 62, 222, 178]", bbox_space="original",
                           text="<think>the red rectangle</think><answer>[66, 62, 222, 178]</answer>")
                row.update(score_row(row, truth["box"], "bbox"))
        step_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
        report = sweep(options)
        print(report["checkpoints"][2]["accuracy"], report["checkpoints"][2]["step"])
        write_sweep_dir(report, "sweep")
        shot = screenshot(Path("sweep/report.html").resolve().as_uri() + "#sample=box", Path(tmp) / "shot.png", Path(tmp) / "profile", size="1280,2000")
        with Image.open(shot) as image:
            image = image.convert("RGB")
            # cut the empty page below the content
            rows_used = [y for y in range(image.height) if image.crop((0, y, image.width, y + 1)).getextrema() != ((255, 255),) * 3]
            image = image.crop((0, 0, image.width, min(image.height, rows_used[-1] + 24)))
            image.quantize(colors=128).save(out, optimize=True)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks" / "figures" / "report.png")
