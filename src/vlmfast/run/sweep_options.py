"""``vlmfast sweep``'s options, checked once: :class:`SweepOptions`. Each option carries its help, panel and
flag on its field (:mod:`vlmfast.declared`); the per-checkpoint run's options are ``infer``'s own fields,
taken by reference (:class:`~vlmfast.run.options.InferOptions`)."""

from __future__ import annotations

from dataclasses import dataclass

from vlmfast.declared import GATES, INPUT, OUTPUT, check_types, nested, option
from vlmfast.errors import UsageError
from vlmfast.run.options import InferOptions

# infer's options a sweep sets itself, per checkpoint or for the whole sweep
PER_CHECKPOINT = ("ckpt", "images", "out", "overwrite", "retry_errors", "max_image_pixels", "overlap",
                  "trust_remote_code", "base", "merge")


@dataclass(frozen=True)
class SweepOptions:
    """``vlmfast sweep``'s options. ``infer`` holds everything each checkpoint's run takes (its ``ckpt``
    and ``out`` are set per checkpoint)."""

    run_dir: str = option(help="A training run's output dir: checkpoint-N (HF Trainer, VLM-R1, TRL), vX-*/checkpoint-N "
                          "(ms-swift) or global_step_N/actor/huggingface (EasyR1, verl).", panel=INPUT, argument=True)
    infer: InferOptions = nested(without=PER_CHECKPOINT, changes={"manifest": dict(
        help="The evaluation set with ground truth: JSONL, or the trainer's parquet / save_to_disk dataset (see infer "
             "--manifest).", required=True),
        # a sweep has no --images: infer's help for these would name it
        "prompt": dict(help="Prompt for the manifest's records without one of their own."),
        "prompt_file": dict(help="File holding the prompt for the manifest's records without one of their own.")})
    out_dir: str = option(help="Where each checkpoint's results file (step-N.jsonl), report.json, report.html and "
                          "plot.png go (rerun to resume).",
                          panel=OUTPUT)
    base: str | None = option(None, help="The model the run started from (dir or hub id), evaluated as step 0: did RL help?",
                              panel=INPUT)
    steps: tuple[int, ...] | str | None = option(None, help="Only these steps, comma-separated (e.g. 100,300).",
                                                 panel=INPUT, type=str)
    fail_if_best_below: float | None = option(
        None, help="Exit 5 when the best checkpoint's accuracy is below X (CI after training).", panel=GATES)
    watch: bool = option(False, help="Keep polling RUN_DIR and evaluate new checkpoints as the trainer writes them (once "
                         "their weights are complete), until Ctrl-C.", panel=INPUT)
    poll_s: float = option(60.0, help="--watch: seconds between looks at RUN_DIR.", panel=INPUT, flag="--poll")
    by: str | None = option(None, help="Also each checkpoint's accuracy per value of this manifest column (a TSV's "
                            "category, a dataset's data_source; dotted for a nested one), and the best step per value.",
                            panel=INPUT)
    # --engine vllm: requests checked against a fresh engine after the first in-place reload
    canary: int = option(8, help="--engine vllm: after the first in-place weight reload, check N requests against a "
                         "fresh engine (0: no check).", panel=INPUT)
    # "all" | "coarse": every k-th checkpoint, then the best's neighbours (run/search.py)
    search: str = option("all", help="all: every checkpoint; coarse: every k-th one (--every), then the best's "
                         "neighbours until both are evaluated.", panel=INPUT)
    every: int | None = option(None, help="--search coarse: evaluate every k-th checkpoint first (default: about 8 of "
                               "them).", panel=INPUT)
    overwrite: bool = option(False, help="Start afresh: move an earlier sweep's rows and records out of the way, "
                             "into OUT_DIR/replaced-<time> (a rerun resumes otherwise; with other settings it stops and "
                             "says what differs).",
                             panel=OUTPUT)
    retry_errors: bool = option(False, help="Resume, and redo every step's error rows (an image since added, a reward "
                                "that failed); the rest is read back.", panel=OUTPUT)
    tensorboard: str | None = option(
        None, help="A TensorBoard log dir (the trainer's works): each checkpoint's figures as scalars at its step under "
        "eval/vlmfast, in DIR/vlmfast-sweep-<manifest> (a rerun replaces that file). Logged with the report, and with "
        "--watch after each new checkpoint (the tensorboard extra).", panel=OUTPUT)
    wandb: str | None = option(
        None, help="PROJECT (a new run) or PROJECT/RUN (the run with id RUN, resumed if it exists: the trainer's works; "
        "only steps it lacks are added): each checkpoint's figures to W&B at its step. Logged with the report, and with "
        "--watch after each new checkpoint (the wandb extra; WANDB_MODE=offline works).", panel=OUTPUT)

    def __post_init__(self):
        check_types(self)
        object.__setattr__(self, "out_dir", str(self.out_dir))
        object.__setattr__(self, "steps", _steps(self.steps))
        if self.infer.manifest is None and not self.infer.images:
            raise UsageError("a sweep needs its evaluation set", hint="give --manifest FILE.jsonl (with ground truth)")
        from vlmfast.files import check_output_dir

        check_output_dir("--out-dir", self.out_dir)
        if self.fail_if_best_below is not None and not 0 <= self.fail_if_best_below <= 1:
            raise UsageError(f"--fail-if-best-below {self.fail_if_best_below}: an accuracy is between 0 and 1",
                             hint="e.g. --fail-if-best-below 0.6")
        if self.overwrite and self.retry_errors:
            raise UsageError("--overwrite starts afresh; --retry-errors resumes and redoes only error rows",
                             hint="drop one of them")
        if not 0 < self.poll_s < float("inf"):  # NaN and inf fail only when the first wait is timed, after the work
            raise UsageError(f"--poll {self.poll_s}: expected a finite number of seconds > 0", hint="e.g. --poll 60")
        from vlmfast.errors import check_choice
        from vlmfast.run.search import SEARCHES

        check_choice("--search", self.search, SEARCHES)
        if self.search == "coarse" and self.watch:
            raise UsageError("--search coarse picks among the checkpoints there now; --watch waits for new ones",
                             hint="drop one of them")
        if self.every is not None and self.every < 1:
            raise UsageError(f"--every {self.every}: expected a stride of 1 or more", hint="e.g. --every 5")
        if self.every is not None and self.search != "coarse":  # else it would be ignored without a word
            raise UsageError(f"--every {self.every} is the stride of --search coarse", hint="add --search coarse, or drop --every")
        if self.tensorboard is not None or self.wandb is not None:  # a missing package is said now, not after the sweep
            from vlmfast.report.trackers import check_trackers

            check_trackers(self.tensorboard, self.wandb)
        if self.canary < 0:
            raise UsageError(f"--canary {self.canary}: expected a number of requests, 0 to skip", hint="e.g. --canary 8")

    def truth_note(self) -> str | None:
        """Before any checkpoint runs: a manifest without any ground truth cannot rank checkpoints. With
        ``--fail-if-best-below`` that is a UsageError now (not an exit 5 after every checkpoint ran); else a
        note to say at once. None when some record has ground truth, or a reward function scores the rows."""
        if self.infer.manifest is None or self.infer.reward:
            return None
        from vlmfast.errors import InputError
        from vlmfast.inputs.convert import read_truths
        from vlmfast.inputs.datasets import DatasetKeys

        keys = DatasetKeys(self.infer.prompt_key, self.infer.answer_key, self.infer.image_key)
        try:
            if any(truth is not None for truth, _ in read_truths(self.infer.manifest, keys).values()):
                return None
        except InputError:  # bad records: the run says them (or, with --skip-bad, keeps them as error rows)
            return None
        none = f"{self.infer.manifest} has no ground truth in any record"
        if self.fail_if_best_below is not None:
            raise UsageError(f"--fail-if-best-below needs ground truth, and {none}",
                             hint='give each record its answer as "solution" (vlmfast score --help names the '
                                  'fields read), or drop --fail-if-best-below')
        return f"{none}: accuracy and the best step will be none"


def _steps(value) -> tuple[int, ...] | None:
    """``--steps 100,300`` → (100, 300); None or "": every step."""
    if not isinstance(value, str):
        return value
    if not value:
        return None
    try:
        steps = tuple(int(s) for s in value.split(",") if s.strip())
    except ValueError:
        raise UsageError(f"--steps {value!r}: expected step numbers", hint="e.g. --steps 100,300") from None
    if not steps:  # "" means every step; commas or blanks alone name none, and a sweep of none would report nothing
        raise UsageError(f"--steps {value!r}: names no step", hint="e.g. --steps 100,300, or leave --steps out for every step")
    return steps
