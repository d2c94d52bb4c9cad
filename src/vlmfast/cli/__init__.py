"""The ``vlmfast`` command line: one module per group of commands over the library, the shared option
declarations and error rendering in :mod:`.common`. Heavy imports (torch, transformers) happen inside
command bodies so ``vlmfast --help`` is instant."""

from __future__ import annotations

from vlmfast.cli import infer, sweep, bench, data, ckpt  # noqa: F401, I001 - importing a module registers its commands, in this order
from vlmfast.cli.common import app

__all__ = ["app", "main", "spread_multi_value"]

MULTI_VALUE_OPTIONS = ("--images",)


def spread_multi_value(argv: list[str], options=MULTI_VALUE_OPTIONS) -> list[str]:
    """``--images a.png b.png dir/`` (what a shell glob expands to) → ``--images a.png --images b.png
    --images dir/``: click options take one value each, users type lists."""
    out: list[str] = []
    current = None  # the list option whose values we are reading
    for arg in argv:
        if arg.startswith("-"):
            name = arg.split("=", 1)[0]
            current = name if name in options else None
        elif current is not None and not (out and out[-1] == current):
            out.append(current)
        out.append(arg)
    return out


def main() -> None:
    import sys

    args = spread_multi_value(sys.argv[1:])
    if "--json" not in args:
        app(args=args, prog_name="vlmfast")
        return
    from vlmfast.report.terminal import print_json

    try:  # --json: a command line click refuses is one JSON error object on stdout too, as every other error
        code = app(args=args, prog_name="vlmfast", standalone_mode=False)
    except Exception as exc:  # click's own classes (typer may bring its own click): told by what they carry
        if not (hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int)):
            raise
        from vlmfast.run.parallel import is_main_process

        if not is_main_process():  # a parallel run: every process refuses the same line, rank 0 says it once
            sys.exit(exc.exit_code)
        try:
            from typer import rich_utils

            rich_utils.rich_format_error(exc)
        except (ImportError, AttributeError):  # typer without rich rendering: click's own words
            exc.show()
        print_json({"error": {"message": exc.format_message(), "hint": "see --help", "problems": [],
                              "exit_code": exc.exit_code}})
        sys.exit(exc.exit_code)
    except BaseException as exc:
        if type(exc).__name__ == "Abort":  # Ctrl-C while click itself was reading the command line
            sys.exit(130)
        raise
    sys.exit(code if isinstance(code, int) else 0)
