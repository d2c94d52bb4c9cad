"""A sweep's figures where the training curves already are: TensorBoard event files and W&B runs.

Each checkpoint's numeric figures are logged at its global step (base at 0) under ``eval/vlmfast/``, so
they sit beside the trainer's own curves without mixing with them. Nested figures are flattened with
``/`` (``pass_at_k/4``, ``vs_base/difference``, ``reward_means/format``); text, booleans and missing
values are left out. Nothing here is imported unless asked for: ``tensorboard`` and ``wandb`` are extras.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from vlmfast.errors import UsageError

PREFIX = "eval/vlmfast"
SKIP = frozenset({"step", "path", "label", "results"})
EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}  # option → (module, extra)


def check_available(option: str) -> None:
    """A UsageError naming the pip command when ``option``'s package is missing — said before a sweep starts,
    not after an hour of evaluation."""
    module, extra = EXTRAS[option]
    if importlib.util.find_spec(module) is None:
        raise UsageError(f"--{option} needs the {module} package, which is not installed",
                         hint=f"pip install 'vlmfast[{extra}]'")


def scalars(figures: dict, prefix: str = PREFIX) -> dict[str, float]:
    """One checkpoint's numeric figures, flattened: name → value."""
    out: dict[str, float] = {}

    def walk(name: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{name}/{key}", inner)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)

    for key, value in figures.items():
        if key not in SKIP:
            walk(f"{prefix}/{key}", value)
    return out


def log_to_tensorboard(report: dict, log_dir, *, prefix: str = PREFIX) -> Path:
    """Every checkpoint's figures as scalars at its step, in a new event file under ``log_dir/vlmfast`` (the
    trainer's log dir works: nothing of its own is touched). A rerun writes a new file with the same steps;
    TensorBoard keeps the newest points. Returns the directory written to."""
    check_available("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    where = Path(log_dir) / "vlmfast"
    writer = SummaryWriter(log_dir=str(where))
    try:
        for c in sorted(report["checkpoints"], key=lambda c: c["step"]):
            for name, value in scalars(c, prefix).items():
                writer.add_scalar(name, value, global_step=c["step"])
    finally:
        writer.close()
    return where


def log_to_wandb(report: dict, target: str, *, prefix: str = PREFIX) -> str:
    """Every checkpoint's figures to W&B: ``PROJECT`` (a new run named after the sweep's run dir) or
    ``PROJECT/RUN_ID`` (that run, resumed: the trainer's own run works). Logged against ``global_step``, a
    metric of its own, so W&B's rule that its internal step only grows never drops a point. Returns the
    run's path."""
    check_available("wandb")
    import wandb

    project, _, run_id = target.partition("/")
    if not project:
        raise UsageError(f"--wandb {target!r}: expected PROJECT or PROJECT/RUN_ID", hint="e.g. --wandb my-grpo/3f9k2x1a")
    name = f"vlmfast eval: {Path(report['run_dir']).name}"
    run = wandb.init(project=project, id=run_id or None, resume="allow" if run_id else None,
                     name=None if run_id else name, job_type="eval", reinit=True)
    try:
        run.define_metric("global_step")
        run.define_metric(f"{prefix}/*", step_metric="global_step")
        for c in sorted(report["checkpoints"], key=lambda c: c["step"]):
            run.log({"global_step": c["step"], **scalars(c, prefix)})
        return run.path if hasattr(run, "path") else project
    finally:
        run.finish()
