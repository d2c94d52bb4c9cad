"""A sweep's figures where the training curves already are: each checkpoint's figures in TensorBoard or
Weights & Biases at its global step (the base at step 0), under ``eval/vlmfast/``.

Every numeric figure of a checkpoint is sent, found generically so that figures added to the sweep report
later appear without a change here: nested dicts are flattened with ``/`` (``samples/pass_at_k/4``,
``vs_base/difference``), bools are sent as 0/1 (a flag over steps is a curve too), and strings, None,
lists and non-finite numbers are left out. ``step`` itself is the x-axis, not a figure.

Neither package is imported unless asked for; :func:`check_trackers` imports what a sweep will need when
its options are read, so a missing package is said before an hour of evaluation, not after.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

from vlmfast.errors import UsageError, VlmfastError

PREFIX = "eval/vlmfast"
TENSORBOARD_INSTALL = "pip install 'vlmfast[tensorboard]'"
WANDB_INSTALL = "pip install 'vlmfast[wandb]'"
_RUN_ID_FORBIDDEN = set("/\\#?%: ")  # characters W&B does not accept in a run id


def scalars(figures: dict, prefix: str = PREFIX) -> dict[str, float | int]:
    """One checkpoint's numeric figures by flattened name: ``PREFIX/accuracy``, ``PREFIX/samples/pass_at_k/1``, …"""
    out: dict[str, float | int] = {}
    for key, value in figures.items():
        if key != "step":
            _flatten(value, f"{prefix}/{key}", out)
    return out


def with_flags(checkpoint: dict, report: dict) -> dict:
    """A checkpoint's figures and, under ``flags``, each flag code of the sweep (``report["flags"]``) as 1 at the
    steps it flags and 0 at the others: a flag over steps is a curve too."""
    from vlmfast.evaluation.flags import CODES

    codes = list(dict.fromkeys([*CODES, *(f["code"] for f in report.get("flags") or [])]))
    raised = {f["code"] for f in report.get("flags") or [] if f.get("step") == checkpoint["step"]}
    return {**checkpoint, "flags": {code: code in raised for code in codes}}


def _flatten(value, name: str, out: dict) -> None:
    if isinstance(value, bool):  # before int: bool is an int subclass
        out[name] = int(value)
    elif isinstance(value, (int, float)):
        if math.isfinite(value):
            out[name] = value
    elif isinstance(value, dict):
        for key, inner in value.items():
            _flatten(inner, f"{name}/{key}", out)


def parse_wandb_target(target: str) -> tuple[str, str | None]:
    """``PROJECT`` or ``PROJECT/RUN`` → (project, run id or None)."""
    parts = target.split("/")
    if len(parts) > 2 or not all(parts):
        raise UsageError(f"--wandb {target!r}: expected PROJECT or PROJECT/RUN",
                         hint="e.g. --wandb my-project or --wandb my-project/sweep-val (the entity: WANDB_ENTITY)")
    project, run = parts[0], (parts[1] if len(parts) == 2 else None)
    if run is not None and _RUN_ID_FORBIDDEN & set(run):
        raise UsageError(f"--wandb {target!r}: a W&B run id cannot hold any of {''.join(sorted(_RUN_ID_FORBIDDEN))!r}",
                         hint="use letters, digits, - and _, e.g. --wandb my-project/sweep-val")
    return project, run


def require_tensorboard() -> None:
    """Import the TensorBoard writer, or say which extra to install."""
    try:
        import tensorboard  # noqa: F401 - torch's writer needs it, and says so less plainly
        import torch.utils.tensorboard  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"--tensorboard needs the tensorboard package ({exc})", hint=TENSORBOARD_INSTALL) from None


def require_wandb() -> None:
    """Import wandb, or say which extra to install."""
    try:
        import wandb  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"--wandb needs the wandb package ({exc})", hint=WANDB_INSTALL) from None


def check_trackers(tensorboard: str | None, wandb: str | None) -> None:
    """What ``--tensorboard`` / ``--wandb`` need, checked before any work: the packages import, the W&B
    target is well formed."""
    if tensorboard is not None:
        if not str(tensorboard).strip():
            raise UsageError("--tensorboard: expected a directory", hint="e.g. --tensorboard out/my-grpo-run/runs")
        if Path(tensorboard).exists() and not Path(tensorboard).is_dir():
            raise UsageError(f"--tensorboard {tensorboard}: a file, not a directory",
                             hint="give the trainer's log dir, or a new directory")
        require_tensorboard()
    if wandb is not None:
        parse_wandb_target(wandb)
        require_wandb()
        _check_wandb_login()


def _check_wandb_login() -> None:
    """Online W&B needs an API key: without one ``wandb.init`` fails after the sweep, so ask now (wandb
    prompts for it in a terminal, and raises without one; no network call)."""
    import os

    import wandb

    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return
    try:
        wandb.login(verify=False)
    except Exception as exc:  # wandb's own UsageError, or whatever its login raises
        raise UsageError(f"--wandb: not logged in to W&B ({exc})",
                         hint="wandb login (or WANDB_API_KEY=…), or WANDB_MODE=offline then wandb sync") from None


def _ordered(report: dict) -> list[dict]:
    return sorted(report["checkpoints"], key=lambda c: c["step"])


def tensorboard_run_name(report: dict) -> str:
    """The subdirectory of the log dir a sweep writes into: ``vlmfast-sweep-<manifest stem>`` — its own
    TensorBoard run, so two evaluation sets of one training run stay apart."""
    manifest = report.get("manifest")
    return f"vlmfast-sweep-{Path(manifest).stem}" if manifest else "vlmfast-sweep"


def log_to_tensorboard(report: dict, log_dir, *, prefix: str = PREFIX, name: str | None = None) -> Path:
    """Write each checkpoint's figures as scalars ``PREFIX/FIGURE`` at its step into a TensorBoard event file
    in ``log_dir/NAME`` (default :func:`tensorboard_run_name`); the event file written.

    The trainer's log dir works: nothing of the trainer's is touched, the sweep is a run of its own. The
    report holds every checkpoint evaluated so far (a resumed sweep reads finished ones back), so a rerun
    replaces the event files of ``log_dir/NAME`` by one new file: one point per step, never duplicates."""
    from torch.utils.tensorboard import SummaryWriter

    directory = Path(log_dir) / (name or tensorboard_run_name(report))
    directory.mkdir(parents=True, exist_ok=True)
    earlier = set(directory.glob("events.out.tfevents.*"))
    writer = SummaryWriter(log_dir=str(directory))
    try:
        for checkpoint in _ordered(report):
            for tag, value in scalars(with_flags(checkpoint, report), prefix).items():
                writer.add_scalar(tag, value, global_step=checkpoint["step"])
    finally:
        writer.close()
    written = [p for p in directory.glob("events.out.tfevents.*") if p not in earlier]
    for old in earlier:  # after the new file is complete: a failed write leaves the old curves
        old.unlink(missing_ok=True)
    return max(written, key=lambda p: p.stat().st_mtime)


def log_to_wandb(report: dict, target: str, *, prefix: str = PREFIX) -> str:
    """Log each checkpoint's figures to W&B, ``target`` ``PROJECT`` (a new run, named after the training
    run's dir) or ``PROJECT/RUN`` (the run with id RUN: created, or resumed when it exists); where it went
    (the run's URL, or its directory when offline).

    Checkpoints go in step order with ``step=`` their global step, and ``PREFIX/step`` is declared the x-axis
    of ``PREFIX/*``, so the curves sit at the right steps even in a run whose own step is already past them
    (the trainer's run, resumed): W&B only accepts increasing steps, and there the figures go without one.
    A resumed run gets only the checkpoints after the last step it holds (W&B history is append-only);
    offline runs know nothing of earlier ones, and log everything again."""
    run = _open_wandb(report, target, prefix)
    try:
        _log_wandb(run, report, prefix, _held_steps(run, prefix, report))
        return run.url or run.dir
    finally:
        run.finish()


def _open_wandb(report: dict, target: str, prefix: str):
    import wandb

    project, run_id = parse_wandb_target(target)
    run = wandb.init(project=project, id=run_id, name=run_id or f"sweep {Path(str(report.get('run_dir') or '')).name}",
                     resume="allow" if run_id else None, job_type="eval",
                     reinit="create_new",  # a run the caller has open (a training script's) stays open
                     settings=wandb.Settings(console="off"),  # the figures only, not the sweep's progress bar
                     config={"run_dir": report.get("run_dir"), "manifest": report.get("manifest"),
                             "out_dir": report.get("out_dir")})
    run.define_metric(f"{prefix}/step")
    run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/step")
    return run


def _held_steps(run, prefix: str, report: dict) -> set[int]:
    """The checkpoint steps ``run`` holds already: the list a sweep keeps in its summary, or (a run logged before
    that list was kept) the report's steps up to the last one logged."""
    held = run.summary.get(f"{prefix}/logged_steps")
    if held is not None:
        return {int(s) for s in held}
    last = run.summary.get(f"{prefix}/step")
    return set() if last is None else {c["step"] for c in report["checkpoints"] if c["step"] <= last}


def _log_wandb(run, report: dict, prefix: str, held: set[int]) -> set[int]:
    """The report's checkpoints ``run`` does not hold yet (``held``: their steps) into it, a step lower than
    the run's own too (``--search coarse`` then a plain sweep fills steps in between; a mended checkpoint under
    ``--watch``): ``PREFIX/step`` is their x-axis. Returns the steps it now holds."""
    held = set(held)
    for checkpoint in _ordered(report):
        step = checkpoint["step"]
        if step in held:
            continue
        # committed at once: a later row without a step of its own must not merge into this one
        run.log({**scalars(with_flags(checkpoint, report), prefix), f"{prefix}/step": step},
                step=step if step >= run.step else None, commit=True)
        held.add(step)
    run.summary[f"{prefix}/logged_steps"] = sorted(held)
    if report.get("best"):
        run.summary[f"{prefix}/best/step"] = report["best"]["step"]
        run.summary[f"{prefix}/best/accuracy"] = report["best"]["accuracy"]
    return held


class Trackers:
    """The trackers a sweep logs to, checked when made (before the sweep) and kept across logs: ``sweep
    --watch`` logs the report so far after each new checkpoint. Each :meth:`log` rewrites TensorBoard's file
    whole; the W&B run is opened on the first and gets only the steps it does not hold yet. :meth:`close`
    finishes the W&B run."""

    def __init__(self, *, tensorboard=None, wandb: str | None = None, prefix: str = PREFIX, check: bool = True):
        if check:  # False: already checked (SweepOptions checks its own)
            check_trackers(None if tensorboard is None else str(tensorboard), wandb)
        self.tensorboard, self.wandb, self.prefix = tensorboard, wandb, prefix
        self._run, self._held = None, set()

    def __bool__(self) -> bool:
        return self.tensorboard is not None or self.wandb is not None

    def log(self, report: dict) -> list[str]:
        """Log the report's checkpoints; what was done, one line each. A tracker that fails (W&B not logged
        in, a read-only log dir) raises a :class:`VlmfastError` whose hint says that a rerun logs it: a rerun
        reads every finished checkpoint back, evaluating nothing."""
        if not report["checkpoints"]:
            return ["nothing logged to TensorBoard or W&B: no checkpoint was evaluated"] if self else []
        said = []
        if self.tensorboard is not None:
            with _said_on_failure("TensorBoard", f"--tensorboard {self.tensorboard}"):
                written = log_to_tensorboard(report, self.tensorboard, prefix=self.prefix)
            said.append(f"wrote {written} (tensorboard --logdir {self.tensorboard})")
        if self.wandb is not None:
            with _said_on_failure("W&B", "wandb login (or WANDB_MODE=offline, then wandb sync)"):
                if self._run is None:
                    self._run = _open_wandb(report, self.wandb, self.prefix)
                    self._held = _held_steps(self._run, self.prefix, report)
                before = self._held
                self._held = _log_wandb(self._run, report, self.prefix, before)
            steps = [c["step"] for c in _ordered(report) if c["step"] not in before]
            said.append(f"logged step(s) {', '.join(map(str, steps))} to W&B: {self._run.url or self._run.dir}"
                        if steps else f"W&B holds every step already: {self._run.url or self._run.dir}")
        return said

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def log_trackers(report: dict, *, tensorboard=None, wandb: str | None = None) -> list[str]:
    """Log a finished sweep's report once (:class:`Trackers`); what was done, one line each."""
    trackers = Trackers(tensorboard=tensorboard, wandb=wandb)
    try:
        return trackers.log(report)
    finally:
        trackers.close()


@contextmanager
def _said_on_failure(tracker: str, fix: str):
    try:
        yield
    except VlmfastError:
        raise
    except Exception as exc:  # whatever the tracker raises: the sweep's own results are safe on disk
        raise VlmfastError(f"the figures are not logged to {tracker}: {type(exc).__name__}: {exc}",
                           hint=f"the sweep's results are on disk: check {fix}, then rerun the same command "
                                "(finished checkpoints are read back, nothing is evaluated again)") from exc
