"""Commands about checkpoints: ``doctor``, ``fix``, ``make-checkpoint``, ``make-images`` and ``demo``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vlmfast.checkpoints.families import BY_KEY as FAMILIES  # the table of families: --family's choices
from vlmfast.cli.common import GEN, Command, MaxNew, UsageError, command, guarded


@command(cls=Command, epilog="Exit codes: 0 ok (or findings without --strict) · 1 error-level findings with --strict · 2 bad checkpoint path.")
def doctor(
    ckpt: Annotated[str, typer.Argument(help="Checkpoint dir or trainer output dir.", show_default=False)],
    base: Annotated[Optional[str], typer.Option(help="Base model dir to compare EOS list, vocabulary and files with.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the findings as one JSON object on stdout.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 on any error-level finding (for CI).")] = False,
):
    """Diagnose a trained checkpoint: cache off, lost EOS or processor files, unmerged shards, LoRA, unsafe weights."""

    def run():
        from vlmfast.checkpoints.doctor import diagnose, doctor_target, findings_as_dicts, strict_exit_code
        from vlmfast.report.terminal import print_json, render_findings

        from vlmfast.run.options import InferOptions
        from vlmfast.run.parity import evaluation_settings

        where = str(doctor_target(ckpt))
        # what `vlmfast infer --ckpt CKPT` would use, against the training configuration beside it
        findings = diagnose(ckpt, base=base, evaluation=evaluation_settings(InferOptions(ckpt=ckpt)))
        if json_out:
            print_json({"checkpoint": where, "base": base, "findings": findings_as_dicts(findings)})
        render_findings(where, findings)
        if strict and (code := strict_exit_code(findings)):
            raise typer.Exit(code)

    guarded(run, json_out, interrupted="doctor writes nothing; rerun the same command")


@command(cls=Command, epilog="Exit codes: 0 fixed, or nothing to fix · 1 errors remain that fix cannot repair (each named, "
                              "with its remedy) · 2 bad path, read-only dir or hub id (nothing written).")
def fix(
    ckpt: Annotated[str, typer.Argument(help="Checkpoint dir to repair in place (backups: *.orig).", show_default=False)],
    processor_from: Annotated[Optional[str], typer.Option(help="Base model dir to copy missing processor, tokenizer and chat-template files (and the EOS list) from.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the unified diff; write nothing.")] = False,
    merge_lora: Annotated[Optional[Path], typer.Option(help="CKPT is a LoRA adapter: write a merged full checkpoint to this dir.")] = None,
):
    """Repair a checkpoint's configs (cache on, EOS list) and missing files, atomically with backups; or merge a LoRA adapter."""

    def run():
        from vlmfast.checkpoints.fix import apply_fix, merge_lora as merge, plan_fix, step_name
        from vlmfast.report.terminal import render_note, stderr

        if merge_lora is not None:
            if dry_run:
                raise UsageError("--dry-run does not apply to --merge-lora", hint="drop one of them")
            result = merge(ckpt, merge_lora, base=processor_from)
            stderr.print(f"merged {ckpt} into {result.out_dir} (base {result.base})", markup=False)
            typer.echo(str(result.out_dir))
            return
        plan = plan_fix(ckpt, processor_from=processor_from)
        if plan.empty:
            left = _what_is_left(plan.target, processor_from)
            render_note(f"{ckpt}: nothing to fix" if not left else f"{ckpt}: nothing fix can change on its own")
            _say_left(left)
            return
        result = apply_fix(plan, dry_run=dry_run)
        if dry_run:
            typer.echo(result.diff, nl=False)
            render_note("dry run: nothing was written")
            return
        stderr.print(f"checkpoint: {plan.target}", markup=False)
        for change in plan.changes():
            stderr.print(f"fixed: {change}", markup=False)
        for backup in result.backups:
            stderr.print(f"backup: {backup}", markup=False)
        if plan.others:  # a run dir resolves to its highest checkpoint: the others are said, not silently left
            render_note(f"not changed, also cache-off: {', '.join(map(step_name, plan.others))} (vlmfast fix "
                        f"{plan.others[0]} and so on; `infer` and `sweep` force the cache on without a fix)")
        _say_left(_what_is_left(plan.target, processor_from))

    guarded(run, interrupted="rerun the same command (fix writes each file whole, and a rerun fixes what is left; a "
                             "merge's folder appears only once it is complete)")


def _what_is_left(target, processor_from) -> list:
    """What doctor still finds after a fix (errors and warnings)."""
    from vlmfast.checkpoints.doctor import diagnose

    return [f for f in diagnose(target, processor_from) if f.severity in ("error", "warning")]


def _say_left(left: list) -> None:
    """Each finding a fix left, with its remedy, so a fix that could not do everything does not look as if it
    had; errors among them end the command with exit code 1 (a `fix && infer` script stops here)."""
    from vlmfast.report.terminal import render_note

    for f in left:
        render_note(f"not fixed: {f.code} ({f.location}): {f.message}" + (f"; {f.fix}" if f.fix else ""))
    errors = sum(f.severity == "error" for f in left)
    if errors:
        render_note(f"{errors} error(s) remain that fix cannot repair on its own: see their remedies above")
        raise typer.Exit(1)


@command("make-checkpoint", cls=Command)
def make_checkpoint(
    out: Annotated[Path, typer.Argument(help="Directory to write the checkpoint into.", show_default=False)],
    preset: Annotated[str, typer.Option(help="tiny (tests) | demo (~6M params, cache-off cost visible on a CPU) | 3b | 7b (the real shapes; GPU benchmarks)")] = "tiny",
    like: Annotated[str, typer.Option(help="grpo (use_cache false everywhere, as trainers save) | base")] = "grpo",
    seed: Annotated[int, typer.Option(help="Weight seed.")] = 0,
    family: Annotated[str, typer.Option(help=f"{' | '.join(FAMILIES)} (Qwen3.5: transformers 5.x only; presets 3b and 7b: qwen2_5_vl only)")] = "qwen2_5_vl",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing directory.")] = False,
):
    """Build a random-weight Qwen-VL checkpoint offline (the family's real model and processor classes)."""

    def run():
        from vlmfast.report.terminal import stderr
        from vlmfast.checkpoints.tiny import STAMP, build_checkpoint
        from vlmfast.files import check_output_dir

        check_output_dir("make-checkpoint", out)  # a file there: an error line, never replaced by --overwrite
        there = (out / STAMP).is_file() and not overwrite
        path = build_checkpoint(out, preset=preset, like=like, seed=seed, overwrite=overwrite, family=family)
        said = "reused the" if there else "wrote a"  # a build with the same arguments whose files are unchanged
        stderr.print(f"{said} {family} checkpoint ({preset}, like {like}):", markup=False)  # the path: on stdout, once
        typer.echo(str(path))

    guarded(run)


MAX_IMAGES, MAX_SIDE = 100_000, 8192  # 8192² px is under PIL's MAX_IMAGE_PIXELS (89,478,485), which readers enforce


@command("make-images", cls=Command)
def make_images(
    out: Annotated[str, typer.Argument(help="Directory to write PNGs into.", show_default=False)],
    count: Annotated[int, typer.Option("-n", "--count", help="How many images.")] = 8,
    seed: Annotated[int, typer.Option(help="Content seed.")] = 0,
    size: Annotated[Optional[int], typer.Option(help="Square side in pixels (default: a mix of small sizes).")] = None,
):
    """Write deterministic sample images (for demos and benchmarks)."""

    def run():
        from vlmfast.checkpoints.tiny import make_images as make
        from vlmfast.errors import UsageError
        from vlmfast.files import check_output_dir

        if not 1 <= count <= MAX_IMAGES:
            raise UsageError(f"-n {count}: expected 1 to {MAX_IMAGES:,} images", hint="e.g. vlmfast make-images OUT -n 8")
        if size is not None and not 1 <= size <= MAX_SIDE:  # a bigger square is past PIL's decompression-bomb limit
            raise UsageError(f"--size {size}: expected a side of 1 to {MAX_SIDE} pixels", hint="e.g. --size 224, or leave it out")
        check_output_dir("make-images", out)  # a file there, or "" (an unset variable): an error line
        for path in make(Path(out), n=count, seed=seed, sizes=[(size, size)] if size else None):
            typer.echo(str(path))

    guarded(run)


@command(cls=Command)
def demo(
    workdir: Annotated[Optional[str], typer.Option(help="Where to build the demo checkpoint and images (reused).")] = None,
    max_new_tokens: MaxNew = 64,
    batch_size: Annotated[int, typer.Option(help="Decode rows: answers decoded at once.", rich_help_panel=GEN)] = 8,
):
    """Build (or reuse) a GRPO-like demo checkpoint and images, then run infer on them — offline, CPU-friendly."""

    def run():
        from vlmfast.cli.demo import run_demo

        run_demo(workdir, max_new_tokens=max_new_tokens, batch_size=batch_size)

    guarded(run)


