"""A results file's bytes: rows rendered as :mod:`vlmfast.run.results` writes them, and whether a file read back
still holds them (:func:`vlmfast.run.results.finalize` leaves such a file as it is: its inode and times too)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path


def render(rows: list[dict]) -> bytes:
    """``rows`` as a results file holds them: one JSON object a line, UTF-8 (as :class:`vlmfast.run.results.ResultsWriter` appends them)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


class ReadRows(dict):
    """Rows :func:`vlmfast.run.results.read_existing` read, and ``read_as``: the file they were read from (:func:`file_state`)."""

    read_as: tuple | None = None


def file_state(st: os.stat_result, data: bytes) -> tuple:
    """A file as read: which file (device, inode), its size and modification time, and its bytes' digest."""
    import hashlib

    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, hashlib.sha256(data).digest()


def unchanged(out: Path, rows: dict, data: bytes) -> bool:
    """Whether ``out`` holds ``data``: ``rows`` were read from it, it is as it was then (not repaired, no rows
    appended) and ``data`` is the bytes that were read."""
    with contextlib.suppress(OSError):
        return (then := getattr(rows, "read_as", None)) is not None and then == file_state(os.stat(out), data)
    return False
