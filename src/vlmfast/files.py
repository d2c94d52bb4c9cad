"""Writing files so a crash never leaves half of one: atomic replace, and publishing a built directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """vlmfast's own cache: ``VLMFAST_CACHE``, else ``$XDG_CACHE_HOME/vlmfast``, else ``~/.cache/vlmfast``."""
    if os.environ.get("VLMFAST_CACHE"):
        return Path(os.environ["VLMFAST_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vlmfast"


def check_output_file(option: str, path) -> None:
    """A UsageError (raised before any work) when ``path`` cannot become a file: it is a directory, or
    the directory it would go in is a file."""
    from vlmfast.errors import UsageError

    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory; a results file is written there",
                         hint=f"name a file, e.g. {option} {path / 'results.jsonl'}")
    if path.parent.exists() and not path.parent.is_dir():
        raise UsageError(f"{option} {path}: {path.parent} is a file, not a directory", hint="choose another path")


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to a temp file beside ``path``, fsync it, then rename it over ``path``: readers
    see the old file or the new one, never a torn one. ``mode`` defaults to 0666 less the umask
    (mkstemp alone would leave 0600)."""
    if mode is None:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def publish_directory(tmp: Path, out: Path, *, replace: bool = True) -> None:
    """Move a finished build into place with ordinary modes (mkdtemp and safetensors create private
    entries; a checkpoint should look like any other). ``replace=False`` only takes the place of an
    empty directory and fails (OSError) rather than delete anything found there."""
    for p in [tmp, *tmp.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    if out.is_dir():
        shutil.rmtree(out) if replace else out.rmdir()
    elif out.exists():
        if not replace:
            raise FileExistsError(f"{out} appeared while building")
        out.unlink()
    os.replace(tmp, out)
