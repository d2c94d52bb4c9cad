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
    import time

    from vlmfast.engines.hf.as_saved import AsSavedEngine, saved_generation_config
    from vlmfast.checkpoints.load import load
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.inputs.requests import collect
    from rich.markup import escape

    from vlmfast.report.progress import ProgressBar
    from vlmfast.report.terminal import render_infer, stderr
    from vlmfast.run.options import InferOptions
    from vlmfast.run.runner import infer
    from vlmfast.engines.hf.scheduler import Scheduler
    from vlmfast.checkpoints.tiny import build_checkpoint, make_images

    from vlmfast.errors import UsageError
    from vlmfast.files import check_output_dir, given_path

    workdir = given_path("--workdir", workdir) if workdir is not None else default_workdir()  # "": refused
    check_output_dir("--workdir", workdir)  # a file there: an error line, not mkdir's traceback
    generation = GenerationSettings(max_new_tokens=max_new_tokens)  # bad settings: refused before anything is built
    if batch_size < 1:
        raise UsageError(f"--batch-size {batch_size}: expected at least 1", hint="e.g. --batch-size 8")
    stderr.print(f"[bold]vlmfast demo[/bold] in {escape(str(workdir))}")
    with stderr.status("building the demo checkpoint (random weights, saved cache-off like a GRPO run)…"):
        import transformers

        # one directory per transformers major: each line decodes its own save (4.57 reads 5.x's through a rewrite)
        ckpt = build_checkpoint(workdir / f"grpo-demo-tf{transformers.__version__.split('.')[0]}", preset="demo", like="grpo")
        images = make_images(workdir / "images", n=8, sizes=DEMO_IMAGE_SIZES)
    out = workdir / "results.jsonl"
    stderr.print(
        f"running: vlmfast infer --ckpt {ckpt} --images {images[0].parent} --template r1 "
        f'--prompt "What shapes are in this image?" --max-new-tokens {max_new_tokens} --batch-size {batch_size} '
        f"--out {out} --overwrite", markup=False,
    )
    options = InferOptions(
        # the images it wrote, not whatever else the folder holds
        ckpt=str(ckpt), images=[str(p) for p in images], prompt="What shapes are in this image?", template="r1",
        out=str(out), overwrite=True, batch_size=batch_size, generation=generation,
    )
    loaded = load(str(ckpt))
    bar = ProgressBar()
    try:
        report = infer(options, progress=bar, loaded=loaded)
    finally:
        bar.stop()
    render_infer(report)

    # What the user got before: plain generate with the saved config (cache off), one image at a time.
    with stderr.status("timing plain HF generate as saved (cache off, one image at a time)…"):
        collected = collect(images=options.images, prompt=options.prompt, template=options.template)
        as_saved = AsSavedEngine(loaded, options.generation, saved_generation_config(loaded))
        start = time.perf_counter()
        before = {r.id: r for _, batch, _ in Scheduler(as_saved).run(collected.requests, collected.image_sizes, 1) for r in batch}
        before_s = time.perf_counter() - start
    same = sum(before[r.id].token_ids == r.token_ids for r in report.results)
    stderr.print(
        f"[bold]plain generate as saved[/bold]: {before_s:.2f} s for {len(before)} samples; "
        f"[bold]vlmfast[/bold]: {report.generate_s:.2f} s → [green]{before_s / report.generate_s:.1f}× faster[/green], "
        f"identical greedy tokens for {same}/{len(before)} samples"
    )
    stderr.print(f"[yellow]note:[/yellow] {escape(timing_note())}")
    first = report.results[0]
    stderr.print(f"first row ({first.id}): {first.n_new_tokens} tokens, finish={first.finish_reason}; "
                 "the text is noise — the weights are random.", markup=False)
    base = workdir / f"base-demo-tf{transformers.__version__.split('.')[0]}"
    me = console_script()
    stderr.print("next, side by side with a base and a plot:\n"
                 f"  {me} make-checkpoint {base} --preset demo --like base\n"
                 f"  {me} bench --ckpt {ckpt} --compare-base {base} --images {images[0].parent} --report {workdir / 'bench'}",
                 markup=False)
    return report


def timing_note(load: float | None = None, cores: int | None = None) -> str:
    """What the demo's speed-up is worth: one timed run each, so it moves with what else the machine runs
    (measured on a shared 2-core machine: 63.7× one run, 12.7× the next). Sharper when the 1-minute load
    average (``load``, default the machine's) is above the cores this process may use."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):  # not on every platform
            load = None
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    note = ("one timed run each: the speed-up moves with what else the machine runs; vlmfast bench repeats the runs "
            "and says when they disagree")
    if load is not None and load > cores:
        note = f"the machine is busy (1-minute load {load:.1f} on {cores} cores): " + note
    return note


def console_script() -> str:
    """How to call vlmfast from the user's shell: ``vlmfast`` when that is this environment's console
    script on PATH, else its path (``scripts/demo.sh`` runs from a virtual environment it never activates)."""
    import os
    import shutil
    import sys
    from pathlib import Path

    mine = Path(sys.executable).parent / "vlmfast"
    on_path = shutil.which("vlmfast")
    if on_path and Path(on_path).resolve() == mine.resolve():
        return "vlmfast"
    try:
        return os.path.relpath(mine) if not os.path.relpath(mine).startswith("..") else str(mine)
    except ValueError:  # another drive (Windows)
        return str(mine)
