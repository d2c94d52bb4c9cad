"""Writing files so a crash never leaves half of one: atomic replace, and publishing a built directory."""

from __future__ import annotations

import contextlib
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


def given_path(option: str, path) -> Path:
    """``path`` as a Path; a UsageError when it is empty text, which Path reads as the current directory
    (an unset shell variable in a script, ``--out-dir "$OUT"``, would write there)."""
    from vlmfast.errors import UsageError

    if not str(path).strip():
        raise UsageError(f"{option}: empty text (an unset shell variable?)", hint=f"give a path after {option} (check the variable that should hold it)")
    return Path(path)


def check_output_file(option: str, path) -> None:
    """A UsageError (raised before any work) when ``path`` cannot become a file: it is a directory, the
    directory it would go in is a file, or nothing can be written there."""
    from vlmfast.errors import UsageError

    path = given_path(option, path)
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory; a results file is written there",
                         hint=f"name a file, e.g. {option} {path / 'results.jsonl'}")
    if path.parent.exists() and not path.parent.is_dir():
        raise UsageError(f"{option} {path}: {path.parent} is a file, not a directory", hint="choose another path")
    if path.is_file():
        try:  # opened for appending and closed: the file is not changed
            with open(path, "ab"):
                pass
        except OSError as exc:
            raise UsageError(f"{option} {path}: cannot be written ({exc.strerror or exc})",
                             hint="choose a path you can write, or fix its permissions") from None
    _check_writable_place(option, path, path.parent)


def refuse_inputs_as_out(option: str, out: Path, inputs: list[Path], ckpt_dir: Path | None = None) -> None:
    """A UsageError when ``out`` is one of ``inputs`` or a file inside ``ckpt_dir``: results written there
    would replace what the run reads."""
    from vlmfast.errors import UsageError

    target = Path(out).resolve()
    # by the file itself (device and inode: a symlink or a hard link to it is it), once per distinct path: a run's
    # 50,000 requests about 10 images resolved 50,000 paths (~5 s); an --out that does not exist is no input
    found = _file_id(target)
    for path in dict.fromkeys(inputs) if found is not None else ():
        if _file_id(path) == found:
            raise UsageError(f"{option} {out} is one of this run's inputs ({path}): the results would replace it",
                             hint=f"give {option} a file of its own, e.g. {option} results.jsonl")
    if ckpt_dir is not None and target.is_relative_to(Path(ckpt_dir).resolve()) and target.exists():
        raise UsageError(f"{option} {out} is a file of the checkpoint {ckpt_dir}: the results would replace it",
                         hint=f"give {option} a file outside the checkpoint, e.g. {option} results.jsonl")


def _file_id(path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def check_output_dir(option: str, path) -> None:
    """A UsageError (raised before any work) when ``path`` cannot be a directory files are written into:
    it is a file, or nothing can be created in it (or in the nearest folder above it that exists)."""
    from vlmfast.errors import UsageError

    path = given_path(option, path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: is a file; a directory is written there",
                         hint=f"name a directory, e.g. {option} {path.with_suffix('')}-out")
    _check_writable_place(option, path, path)


def _check_writable_place(option: str, path: Path, directory: Path) -> None:
    """Try to create (and remove) a file in ``directory``, or in the nearest folder above it that exists
    (``mkdir -p`` would start there): permission bits alone do not tell (root, read-only mounts)."""
    from vlmfast.errors import UsageError

    existing = directory if str(directory) else Path(".")
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{option} {path}: {existing} is a file, not a directory", hint="choose another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=".vlmfast-probe.", dir=existing)
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot write in {existing} ({exc.strerror or exc})",
                         hint="choose a place you can write, or fix its permissions") from None
    os.close(fd)
    os.unlink(probe)


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


def replaceable_directory(path, *, command: str, overwrite: bool, marker: str) -> Path:
    """``path`` as a directory a build may take whole (it is built beside it, then replaces it): not empty text
    (the current directory), not the current directory or one above it, and with ``overwrite`` only a directory
    that is empty or holds the ``marker`` file of an earlier build. Else a UsageError, before any work."""
    from vlmfast.errors import UsageError

    out = given_path(command, path)
    here, there = Path.cwd().resolve(), out.resolve()
    if there == here or there in here.parents:
        raise UsageError(f"{command} {out}: is the current directory or holds it; a build takes a directory of its "
                         "own, which --overwrite replaces whole", hint=f"name a new directory, e.g. vlmfast {command} out-dir")
    if overwrite and out.is_dir() and any(out.iterdir()) and not (out / marker).is_file():
        raise UsageError(f"{command} {out}: holds files that are not an earlier build ({marker}): --overwrite replaces "
                         "only a build of this command", hint="choose another directory, or move that one aside yourself")
    return out


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


@contextlib.contextmanager
def held_alone(path: Path, option: str):
    """``path`` (a results file, a sweep's folder) written by this process alone while the block runs: an
    exclusive lock on a hidden ``.NAME.lock`` beside it, removed after. A second run onto the same path is
    refused (a UsageError naming the process that holds it) instead of mixing its rows with the first's.
    Folders made for the lock are removed after if nothing else was written into them; where nothing can
    be written, or the file system has no locks (Lustre without ``-o flock``, some FUSE and SMB mounts),
    the block runs unlocked, as it did before locks."""
    import fcntl

    from vlmfast.errors import UsageError

    lock = Path(path).absolute()
    lock = lock.with_name(f".{lock.name}.lock")
    made = [d for d in [lock.parent, *lock.parent.parents] if not d.exists()]  # the deepest first
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only place: the run says so itself, where it writes
        fd = None
    mine = False  # the lock file is this run's to remove (not another run's, which holds it)
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                mine = True
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "another process"
                raise UsageError(f"{option} {path} is being written by another vlmfast run (process {holder})",
                                 hint=f"wait for it to finish, or give another {option}") from None
            except OSError:  # no locks here
                mine = True
        yield
    finally:
        if fd is not None:
            if mine:
                lock.unlink(missing_ok=True)  # before the lock goes: a later run finds a fresh file
            os.close(fd)
        for folder in made:
            try:
                folder.rmdir()  # only when empty: what the run wrote stays
            except OSError:
                break


def part_files(out: Path) -> list[Path]:
    """The part files of a multi-process run beside ``out`` (``.NAME.partR``, one per process)."""
    import glob

    return sorted(Path(out).parent.glob(glob.escape(f".{Path(out).name}.part") + "*"))


def holds_rows(out: Path) -> bool:
    """Whether a resume onto ``out`` would keep rows: ``out`` itself, or the part files a parallel run that
    failed or was interrupted left beside it (before a rerun folds them in, ``out`` may not exist yet)."""
    return any(p.is_file() and p.stat().st_size for p in [Path(out), *part_files(out)])
