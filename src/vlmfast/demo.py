"""``vlmfast demo``: a GRPO-like checkpoint (cache saved off, as trainers leave it), sample images,
one ``infer`` run with the report — offline, on a CPU, in about a minute."""

from __future__ import annotations

import os
from pathlib import Path

DEMO_IMAGE_SIZES = [(224, 224), (280, 196), (196, 280), (252, 252)]  # 64–81 image tokens each


def default_workdir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "vlmfast" / "demo"


def run_demo(workdir: Path | None = None, *, max_new_tokens: int = 64, batch_size: int = 8):
    from .engine import GenerationSettings
    from .report import ProgressBar, render_infer, stderr
    from .runner import InferOptions, infer
    from .tiny import build_checkpoint, make_images

    workdir = Path(workdir) if workdir else default_workdir()
    stderr.print(f"[bold]vlmfast demo[/bold] in {workdir}")
    with stderr.status("building the demo checkpoint (random weights, saved cache-off like a GRPO run)…"):
        import transformers

        # one directory per transformers major: checkpoints saved by 5.x do not load in 4.57
        ckpt = build_checkpoint(workdir / f"grpo-demo-tf{transformers.__version__.split('.')[0]}", preset="demo", like="grpo")
        images = make_images(workdir / "images", n=8, sizes=DEMO_IMAGE_SIZES)
    out = workdir / "results.jsonl"
    stderr.print(
        f"running: vlmfast infer --ckpt {ckpt} --images {images[0].parent} --template r1 "
        f'--prompt "What shapes are in this image?" --max-new-tokens {max_new_tokens} --batch-size {batch_size} '
        f"--out {out} --overwrite"
    )
    options = InferOptions(
        ckpt=str(ckpt), images=[str(images[0].parent)], prompt="What shapes are in this image?", template="r1",
        out=str(out), overwrite=True, batch_size=batch_size, generation=GenerationSettings(max_new_tokens=max_new_tokens),
    )
    bar = ProgressBar()
    try:
        report = infer(options, progress=bar)
    finally:
        bar.stop()
    render_infer(report)
    first = report.results[0]
    stderr.print(f"first row ({first.id}): {first.n_new_tokens} tokens, finish={first.finish_reason}; "
                 "the text is noise — the weights are random.")
    stderr.print(f"compare with plain HF generate as saved: vlmfast bench --ckpt {ckpt} --images {images[0].parent} "
                 f'--prompt "What shapes are in this image?"')
    return report
