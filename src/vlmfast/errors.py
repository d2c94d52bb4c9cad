"""Typed errors users can hit, and the exit codes the CLI maps them to.

Every error carries a *hint*: what to do about it. The CLI renders them once; library users
catch :class:`VlmfastError`.
"""

from __future__ import annotations

# Exit codes (documented in docs/reference.md and `vlmfast --help`). Stable: CI scripts depend on them.
EXIT_FAILURE = 1  # an unexpected runtime failure (a bug or an environment problem)
EXIT_BAD_INPUT = 2  # bad arguments, inputs or checkpoint; nothing was written
EXIT_SLOWER_THAN_BASE = 3  # bench --fail-if-slower gate tripped
EXIT_CACHE_OFF = 4  # bench --fail-on-cache-off gate tripped
EXIT_LESS_ACCURATE = 5  # bench --fail-if-less-accurate gate tripped
EXIT_INTERRUPTED = 130  # Ctrl-C; finished rows are kept, rerun the same command to resume


def check_choice(option: str, value, choices) -> None:
    """UsageError unless ``value`` is one of ``choices``; ``option`` names where the value came from."""
    if value not in choices:
        raise UsageError(f"{option} {value}: unknown", hint=f"use one of: {', '.join(map(str, choices))}")


class VlmfastError(Exception):
    """Base class: a problem the user can fix. ``hint`` says how."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(VlmfastError):
    """Options that cannot work together, or an impossible device/dtype/attention combination."""

    exit_code = EXIT_BAD_INPUT


class InputError(VlmfastError):
    """Images, prompts or manifests that are missing, unreadable or malformed."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, hint: str | None = None, problems: list | None = None):
        super().__init__(message, hint)
        self.problems = problems or []


class CheckpointError(VlmfastError):
    """A checkpoint path that does not exist, holds no weights or cannot be loaded; ``problems``: one line per
    checkpoint when several are refused at once (a sweep's)."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, hint: str | None = None, problems: list | None = None):
        super().__init__(message, hint)
        self.problems = problems or []


class Interrupted(VlmfastError):
    """Ctrl-C during a run: what is on disk, and how to go on."""

    exit_code = EXIT_INTERRUPTED


class RewardError(VlmfastError):
    """A user's reward function raised, or returned something that is not a reward. Exit code 1 (the
    base class's): the inputs were valid, the user's code failed at run time."""
