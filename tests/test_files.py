import os

import pytest

from vlmfast.files import atomic_write, publish_directory


def test_atomic_write_gives_ordinary_modes_and_whole_files(tmp_path):
    target = tmp_path / "f.json"
    target.write_text("old")
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new" and oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temp file left behind


def test_publish_without_replace_never_deletes_what_it_finds(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    (build / "a").write_text("x")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("precious")
    with pytest.raises(OSError):
        publish_directory(build, out, replace=False)
    assert (out / "mine.txt").read_text() == "precious"
    (out / "mine.txt").unlink()
    publish_directory(build, out, replace=False)  # an empty directory is taken over
    assert (out / "a").read_text() == "x" and oct(out.stat().st_mode & 0o777) == oct(0o755)


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_lock_covers_a_folder_it_makes_and_steps_aside_on_a_file_system_without_locks(tmp_path, monkeypatch):
    import errno
    import fcntl

    from vlmfast.errors import UsageError
    from vlmfast.files import held_alone

    out = tmp_path / "new" / "deeper" / "r.jsonl"  # its folder does not exist yet: the first run makes it
    with held_alone(out, "--out"):
        with pytest.raises(UsageError, match="is being written by another vlmfast run"):
            with held_alone(out, "--out"):
                pass
    assert not (tmp_path / "new").exists()  # made for the lock, left empty: removed
    with held_alone(out, "--out"):
        out.write_text("rows\n")
    assert out.read_text() == "rows\n" and not list(out.parent.glob(".*lock"))  # what the run wrote stays

    def no_locks(fd, how):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with held_alone(out, "--out"):  # Lustre without -o flock: unlocked, as before locks
        pass
    assert not list(out.parent.glob(".*lock"))


def test_an_output_path_of_empty_text_is_refused_not_read_as_the_current_directory(tmp_path, monkeypatch):
    """``--out-dir "$OUT"`` with OUT unset: Path("") is ".", and a sweep wrote into (and with --overwrite moved
    the run records out of) whatever folder the user stood in."""
    from conftest import cli

    from vlmfast.errors import UsageError
    from vlmfast.files import check_output_dir, check_output_file

    monkeypatch.chdir(tmp_path)
    for check in (check_output_dir, check_output_file):
        for text in ("", " "):
            with pytest.raises(UsageError, match="--x: empty text"):
                check("--x", text)
    from vlmfast.run.options import InferOptions
    from vlmfast.run.sweep import SweepOptions

    with pytest.raises(UsageError, match="--out-dir: empty text"):
        SweepOptions(run_dir=str(tmp_path), out_dir="", infer=InferOptions(ckpt=str(tmp_path), images=["x.png"], prompt="p"))
    for command in (("sweep", tmp_path, "--manifest", tmp_path / "m.jsonl", "--out-dir", ""),
                    ("bench", "--ckpt", tmp_path, "--synthetic", "1", "--report", ""), ("demo", "--workdir", "")):
        r = cli(*command)
        assert r.returncode == 2 and "empty text" in r.stderr and list(tmp_path.iterdir()) == [], (command, r.stderr)
    r = cli("make-images", "", "-n", "1")
    assert r.returncode == 2 and "empty text" in r.stderr and list(tmp_path.iterdir()) == [], r.stderr


def test_an_input_path_of_empty_text_is_refused_not_read_as_the_current_directory(tmp_path, monkeypatch):
    from conftest import cli

    monkeypatch.chdir(tmp_path)
    r = cli("doctor", "")
    assert r.returncode == 2 and "empty text" in r.stderr and "Traceback" not in r.stderr, r.stderr
    (tmp_path / "r.jsonl").write_text('{"id": "a", "text": "x"}\n')
    r = cli("score", tmp_path / "r.jsonl", "--manifest", "")
    assert r.returncode == 2 and "--manifest: empty text" in r.stderr and "Traceback" not in r.stderr, r.stderr
