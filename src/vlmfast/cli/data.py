"""``vlmfast score`` and ``vlmfast convert``: results and datasets, no model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vlmfast.cli.common import (AnswerKey, BboxSpace, Command, ImageKey, ImageRoot, Iou, Json, PromptKey, Reward, RewardKwargs,
                                RewardThreshold, RewardWeights, Scorer, choice, command, guarded)


@command(cls=Command, epilog="Exit codes: 0 ok · 1 a --reward function raised (without --skip-bad) · 2 unreadable results or "
                              "manifest, bad options · 130 interrupted.")
def score(
    results: Annotated[Path, typer.Argument(help="A results JSONL: one object per line with \"id\" and \"text\" (vlmfast infer's --out, or another tool's rows).", show_default=False)],
    manifest: Annotated[str, typer.Option(help="The manifest with ground truth (solution / answer, optional scorer per row), or the trainer's parquet / save_to_disk dataset (see infer --manifest).")],
    prompt_key: PromptKey = None,
    answer_key: AnswerKey = None,
    image_key: ImageKey = None,
    image_root: ImageRoot = None,
    scorer: Scorer = "auto",
    iou: Iou = 0.5,
    bbox_space: BboxSpace = None,
    reward: Reward = None,
    reward_weights: RewardWeights = None,
    reward_kwargs: RewardKwargs = None,
    reward_threshold: RewardThreshold = 1.0,
    skip_bad: Annotated[bool, typer.Option("--skip-bad", help="--reward: a row whose reward function raises gets reward_error instead of stopping the command.")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Also write the rescored rows here (JSONL; replaced if it exists; the results file itself rescores it in place, and the record of its run beside it, results.run.json, then names this scoring).")] = None,
    by: Annotated[Optional[str], typer.Option("--by", metavar="COLUMN", help="Also the accuracy per value of this manifest column (a TSV's category, a dataset's data_source; dotted for a nested one), or of the rows' own field where the manifest has none.")] = None,
    json_out: Json = False,
):
    """Score an existing results file against a manifest's ground truth — no model, no GPU."""

    def run():
        from vlmfast.report.terminal import print_json, render_scores
        from vlmfast.run.rescore import rescore_file
        from vlmfast.evaluation.rewards import check_reward_options, load_rewards
        from vlmfast.evaluation.scoring import SCORERS

        from vlmfast.files import check_output_file
        from vlmfast.inputs.datasets import DatasetKeys

        from vlmfast.run.options import check_image_root, check_iou

        if out is not None:
            check_output_file("--out", out)
        check_image_root(image_root)
        check_iou(iou)
        check_reward_options(reward, weights=reward_weights, kwargs=reward_kwargs, threshold=reward_threshold)
        scoring = load_rewards(reward, weights=reward_weights, kwargs=reward_kwargs,
                               threshold=reward_threshold) if reward else None
        summary = rescore_file(results, manifest, scorer=choice("--scorer", scorer, SCORERS), iou=iou,
                               bbox_space=bbox_space, out=out, reward=scoring, skip_bad=skip_bad,
                               keys=DatasetKeys(prompt_key, answer_key, image_key), by=by,  # the columns and images infer read
                               image_root=image_root,
                               scoring={"scorer": scorer, "iou": iou, "bbox_space": bbox_space, "reward": reward or None,
                                        "reward_weights": reward_weights, "reward_kwargs": reward_kwargs,
                                        "reward_threshold": reward_threshold})
        render_scores(str(results), summary)
        if json_out:
            print_json(summary)

    guarded(run, json_out, interrupted="rerun the same command (score writes each file whole or not at all, and a "
                                     "rerun scores the rows again)")


@command(cls=Command, epilog="Exit codes: 0 written · 2 unreadable or bad records (all listed; nothing written).")
def convert(
    source: Annotated[Path, typer.Argument(help="A VLM-R1 REC/test JSON(L), an ms-swift dataset JSONL or R1-V evaluation lines.", show_default=False)],
    out: Annotated[Path, typer.Option(help="Manifest to write (JSONL).")],
    format_: Annotated[str, typer.Option("--format", help="auto | vlmr1 | swift | r1v")] = "auto",
    image_root: Annotated[Optional[str], typer.Option(help="Directory the records' relative image paths are under (default: the source file's directory).")] = None,
):
    """Turn a GRPO dataset file into a vlmfast manifest with ground truth (for infer, bench and score). Relative
    image paths are written relative to the manifest's own directory, so it runs from anywhere."""

    def run():
        from vlmfast.inputs.convert import FORMATS, convert_file, rebase_images, write_manifest
        from vlmfast.files import check_output_file, refuse_inputs_as_out
        from vlmfast.report.terminal import stderr

        check_output_file("--out", out)
        refuse_inputs_as_out("--out", out, [source])  # the dataset itself, replaced by its manifest
        rows = convert_file(str(source), choice("--format", format_, FORMATS), image_root=image_root)
        path = write_manifest(rebase_images(rows, str(source) if image_root is None else ".", str(out)), str(out))
        stderr.print(f"wrote {len(rows)} record(s) to {path}", markup=False)
        unscored = sum("solution" not in r for r in rows)
        if unscored:
            stderr.print(f"note: {unscored} of them without ground truth (no solution or answer): they run, unscored",
                         markup=False)
        if image_root is not None and not Path(image_root).is_dir():  # fine for a manifest meant for another machine
            stderr.print(f"note: --image-root {image_root} is not a folder here: the image paths point into it, and "
                         "infer reads them only where it exists", markup=False)
        typer.echo(str(path))

    guarded(run, interrupted="rerun the same command (the manifest is written whole or not at all)")


