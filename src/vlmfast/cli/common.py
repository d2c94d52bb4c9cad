"""What every command shares: the Typer app and its help style, the help panels, the options other commands
take as ``infer`` declares them (made from the library's fields by :mod:`vlmfast.cli.build`), and the error
rendering."""

from __future__ import annotations

import contextlib

from typing import Annotated

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from vlmfast.declared import FAST, GATES, GEN, INPUT, MODEL, OUTPUT, SCALE, SCORE  # noqa: F401 - the help panels, for every command
from vlmfast.errors import EXIT_INTERRUPTED, UsageError, VlmfastError, check_choice

EXIT_CODES_HELP = """Exit codes: 0 ok · 1 unexpected failure · 2 bad input, options or checkpoint (nothing written) ·
3 bench --fail-if-slower tripped · 4 bench --fail-on-cache-off tripped · 5 bench --fail-if-less-accurate or
sweep --fail-if-best-below tripped · 130 interrupted (rerun to resume)."""


class Command(TyperCommand):
    """Help as people write it: ``vlmfast doctor [OPTIONS] CKPT`` and flags without a type label."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = (param.metavar or param.name).upper()
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_help(self, ctx, formatter) -> None:
        _plain_metavars(self, ctx)
        super().format_help(ctx, formatter)


class Group(TyperGroup):
    """The top level's help in the same style (``--version`` without a type label)."""

    def format_help(self, ctx, formatter) -> None:
        _plain_metavars(self, ctx)
        super().format_help(ctx, formatter)


def _plain_metavars(command, ctx) -> None:
    for param in command.get_params(ctx):
        if getattr(param, "is_flag", False) and param.metavar is None:  # --help and every on/off option
            param.metavar = ""
        elif isinstance(param, TyperArgument) and param.metavar is None:
            param.metavar = param.name.upper()


app = typer.Typer(
    cls=Group,
    name="vlmfast",
    help="Fast, honest inference for GRPO-trained vision-language checkpoints (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5).",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
command = app.command

Json = Annotated[bool, typer.Option("--json", help="Print the report as one JSON object on stdout.", rich_help_panel=OUTPUT)]


def _declared():
    """The options other commands take as ``infer`` declares them (on the library's fields)."""
    from vlmfast.cli.build import annotated
    from vlmfast.engines.rows import GenerationSettings
    from vlmfast.run.options import InferOptions

    names = ("prompt_key", "answer_key", "image_key", "image_root", "scorer", "iou", "bbox_space", "reward",
             "reward_weights", "reward_kwargs", "reward_threshold")
    return (*annotated(InferOptions, *names), *annotated(GenerationSettings, "max_new_tokens"))


(PromptKey, AnswerKey, ImageKey, ImageRoot, Scorer, Iou, BboxSpace, Reward, RewardWeights, RewardKwargs, RewardThreshold,
 MaxNew) = _declared()


def _version(value: bool):
    if value:
        from vlmfast import __version__

        typer.echo(f"vlmfast {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")] = False):
    """Fast, honest inference for GRPO-trained vision-language checkpoints."""


INTERRUPTED_HINT = "rerun the same command"


def guarded(fn, json_out: bool = False, *, interrupted: str = INTERRUPTED_HINT):
    """Render VlmfastErrors once with their hint and exit code; Ctrl-C exits 130 with ``interrupted``, the
    command's own hint: what a rerun does after a Ctrl-C that reaches here (the runner says what a run left on
    disk while it decodes; a Ctrl-C that reaches here came before that, or after, while a run's rows were read
    back and its report made). ``json_out`` (``--json``): the error is also a JSON object on stdout,
    ``{"error": {message, hint, problems, exit_code}}``, so a script reading stdout gets JSON whatever the exit
    code."""
    from vlmfast.run.parallel import is_main_process
    from vlmfast.report.terminal import print_json, render_error, stderr

    try:
        with terminate_as_interrupt():
            return fn()
    except VlmfastError as exc:
        if is_main_process():  # every process of a parallel run hits the same input error: say it once
            render_error(exc)
            if json_out:
                print_json({"error": {"message": exc.message, "hint": exc.hint, "problems": [str(p) for p in getattr(exc, "problems", [])],
                                      "exit_code": exc.exit_code}})
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        from rich.markup import escape

        stderr.print(f"[yellow]interrupted[/yellow]; {escape(interrupted)}.")
        if json_out and is_main_process():
            print_json({"error": {"message": "interrupted", "hint": interrupted,
                                  "problems": [], "exit_code": EXIT_INTERRUPTED}})
        raise typer.Exit(EXIT_INTERRUPTED) from None


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM (what Slurm, ``timeout`` and ``kill`` send) ends a command as Ctrl-C does: the write in
    progress finishes, the run says what is on disk and how to resume, exit 130 — not a silent death."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def finishing(report_exit_code: int = 0):
    """The last writes of a command whose work is done (its report's files, the report printed): a Ctrl-C or
    SIGTERM meanwhile is held until they are complete, then said, and the command ends with the report's own
    ``report_exit_code`` — stopping half-way would leave a report that disagrees with what is on disk. A second
    one stops at once."""
    from vlmfast.run.results import sigint_deferred

    written = False
    try:
        with sigint_deferred(second_stops=True):
            yield
            written = True
    except KeyboardInterrupt:
        if not written:  # a second one, inside the writes: stop now
            raise
        from vlmfast.report.terminal import render_note

        render_note("interrupted while the finished work's report was written: it was written whole first")
        raise typer.Exit(report_exit_code) from None


def explicit_params(ctx) -> frozenset[str]:
    """The parameters given on the command line (or by environment), not left at their defaults: what
    ``--match-training`` must leave as given."""
    # by the source's name: Typer may bring its own click, whose ParameterSource is another class
    return frozenset(name for name in ctx.params
                     if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP"))


def choice(option: str, value: str | None, choices) -> str | None:
    """``value`` when it is one of ``choices`` (None passes: the library's default applies)."""
    if value is not None:
        check_choice(option, value, choices)
    return value
