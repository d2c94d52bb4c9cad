"""What a sweep's output dir remembers: the settings that shaped its rows, and each checkpoint's figures as
they were measured.

Beside each step's results file ``step-N.jsonl`` (``base.jsonl``) sits ``step-N.run.json``: the settings
(manifest, prompt, template, generation, pixels, scoring, reward, engine), the versions, and the figures
of the run that generated the rows. A rerun into the same ``--out-dir``

- with the same settings resumes, and a checkpoint it had finished keeps the speed it was measured at
  (rereading rows measures nothing: tokens/s and decode row utilization would be null and load seconds 0);
- with other settings is an error listing what differs (rows made one way must not be reported as made
  another), unless ``--overwrite`` (start afresh) or another ``--out-dir``.
Another vlmfast, torch or transformers version is only said: it changes no setting. The record also holds
the fingerprint of the weights evaluated (:mod:`vlmfast.checkpoints.fingerprint`): a checkpoint whose
files changed since is evaluated again, and said. Also here: what a sweep says of its ``--base``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from vlmfast.errors import UsageError

MEASURED = ("tokens_per_s", "decode_row_utilization", "load_s", "swap_s", "reload_s", "canary_s")
ABSENT_MEANS = {"resize_rule": "qwen"}  # settings older records lack, and the value every run before them had
SAME_BY_CONTENT = ("manifest",)  # compared by its digest: the same file named from another directory is the same


def settings_of(infer, *, digest: bool = True) -> dict:
    """The settings of a sweep's ``infer`` options that shape its rows (paths as given, the manifest also by
    its content's digest, unless not ``digest``)."""
    manifest = infer.manifest
    digest = _digest(Path(manifest)) if manifest and digest else None
    generation = asdict(infer.generation)
    return {
        "manifest": manifest, "manifest_sha256": digest, "images": infer.images, "prompt": infer.prompt,
        "prompt_key": infer.prompt_key, "answer_key": infer.answer_key, "image_key": infer.image_key,
        "format_prompt": infer.format_prompt,
        "prompt_file": infer.prompt_file, "template": infer.template, "system": infer.system,
        "generation": generation, "min_pixels": infer.min_pixels, "max_pixels": infer.max_pixels,
        "resize_rule": infer.resize_rule,
        "scorer": infer.scorer, "iou": infer.iou, "bbox_space": infer.bbox_space, "reward": infer.reward,
        "reward_weights": infer.reward_weights, "reward_kwargs": infer.reward_kwargs,
        "reward_threshold": infer.reward_threshold, "engine": infer.engine,
        # resolved (a resume from another directory names the same folder); records written before it have no key: not compared
        "image_root": os.path.abspath(infer.image_root) if infer.image_root else None,
    }


def _digest(manifest: Path) -> str | None:
    """The manifest's content digest: a file's bytes, or a dataset folder's files (names and bytes, sorted),
    read in blocks (a parquet file of embedded images can be gigabytes)."""
    files = [manifest] if manifest.is_file() else sorted(p for p in manifest.rglob("*") if p.is_file()) if manifest.is_dir() else []
    if not files:
        return None
    h = hashlib.sha256()
    for path in files:
        if path != manifest:
            h.update(str(path.relative_to(manifest)).encode("utf-8") + b"\0")
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    return h.hexdigest()[:16]


def sidecar(results: Path) -> Path:
    """``step-N.jsonl`` → ``step-N.run.json``."""
    return results.with_name(results.name.removesuffix(".jsonl") + ".run.json")


def check(out_dir: Path, settings: dict, overwrite: bool) -> list[str]:
    """Before a sweep: with ``overwrite``, move every step's rows and record out of the way, into a
    ``replaced-<time>`` folder of ``out_dir`` (a sweep that then fails at its first checkpoint has lost
    nothing; the note says where they went); else a UsageError when an earlier run's recorded settings
    differ from ``settings``. Returns notes (where the rows went; other versions)."""
    out_dir = Path(out_dir)
    records = sorted(out_dir.glob("*.run.json")) if out_dir.is_dir() else []
    if overwrite:
        old = [p for p in [*records, *(sorted(out_dir.glob("step-*.jsonl")) if out_dir.is_dir() else []),
                           out_dir / "base.jsonl"] if p.is_file()]
        if not old:
            return []
        aside = move_aside(out_dir, old)
        return [f"--overwrite: the earlier sweep's {len(old)} results and record file(s) were moved to {aside} "
                "(delete it once this sweep's figures are what you want)"]
    from vlmfast.files import holds_rows

    notes = []
    for path in records:
        results = path.with_name(path.name.removesuffix(".run.json") + ".jsonl")
        said = compare(path, settings, f"{out_dir} holds rows made with other settings ({path.name})",
                       hint="rerun with --overwrite to start afresh, or give another --out-dir", rows=holds_rows(results))
        if said and not notes:
            notes.append(f"{out_dir}: {said}")
    return notes


def move_aside(out_dir: Path, paths: list[Path]) -> Path:
    """Move ``paths`` into a new ``replaced-<time>`` folder of ``out_dir`` (kept, not deleted); returns it."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = next(d for k in range(1, 1000) if not (d := out_dir / (f"replaced-{stamp}" + (f"-{k}" if k > 1 else ""))).exists())
    aside.mkdir()
    for path in paths:
        path.rename(aside / path.name)
    return aside


def compare(path: Path, settings: dict, what: str, hint: str, rows: bool = True) -> str | None:
    """A UsageError (``what``: the differences follow) when the record at ``path`` holds other settings than
    ``settings``; else a note when other versions made its rows (None when they are the same). Only the
    settings the record holds are compared: a sweep's names no ``ckpt`` (its file names the step), and one
    ``infer`` wrote (a sweep's step cut short) no inputs, which may grow between runs. A record that is there but
    unreadable (empty, cut short, not a run's) is refused as a missing one is when ``rows`` lie beside it: read as
    "no difference", a resume completed the rows with other settings, and a sweep then wrote a record that vouched
    for them. Without rows it vouches for nothing: the step's own record replaces it."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        earlier = f"{type(exc).__name__}: {str(exc)[:80]}"
    if not isinstance(earlier, dict) or not isinstance(earlier.get("settings"), dict):
        if not rows:
            return None
        why = earlier if isinstance(earlier, str) else "no settings in it"
        raise UsageError(f"{path}: the record of the settings and weights that made the rows beside it is unreadable "
                         f"({why}): resuming could mix the answers of two models or prompts", hint=hint)
    differs = setting_differences(earlier, settings)
    if differs:
        raise UsageError(f"{what}: " + "; ".join(differs), hint=hint)
    from vlmfast.timing import versions

    before, now = earlier.get("versions", {}), versions()
    changed = [f"{k} {before[k]} → {now[k]}" for k in ("vlmfast", "torch", "transformers")
               if k in before and k in now and _release(before[k]) != _release(now[k])]
    return f"earlier rows were made with {', '.join(changed)}; resuming with the same settings" if changed else None


def setting_differences(record, settings: dict) -> list[str]:
    """Each of ``settings`` that the run ``record`` (a ``.run.json``'s object) holds with another value, as
    "name: then-value then, now-value now" (see :func:`compare`)."""
    then = record.get("settings", {}) if isinstance(record, dict) else {}
    then = {**ABSENT_MEANS, **then}  # a record from before a setting existed ran with what it means now
    return [line for key, value in settings.items() if key not in SAME_BY_CONTENT and key in then
            for line in _differences(key, _norm(then[key]), _norm(value))]


def _release(version) -> str:
    """A version without its local build tag (``2.14.1+cu130`` → ``2.14.1``): records written before every
    read came from the package metadata hold either spelling for one installation."""
    return str(version).split("+")[0]


def record(results: Path, settings: dict, figures: dict) -> None:
    """Write a finished checkpoint's record beside its results file (atomically)."""
    from vlmfast.files import atomic_write
    from vlmfast.timing import versions

    data = {"settings": settings, "versions": versions(), "figures": {k: figures[k] for k in MEASURED if k in figures},
            "fingerprint": figures.get("fingerprint"),
            **{k: figures[k] for k in ("fingerprint_of", "manifest", "path") if k in figures},
            "runtime": figures["runtime"] if "runtime" in figures else _read(sidecar(results)).get("runtime")}
    atomic_write(sidecar(results), (json.dumps(data, indent=1, default=str) + "\n").encode("utf-8"))


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def runtime_note(results: Path, runtime: dict) -> str | None:
    """What to say when ``results``' rows were made on another runtime (engine, device, dtype) than this run's:
    the settings match, so the rows are kept, but greedy tokens differ between bfloat16 and float32 (a run cut
    short on a GPU and resumed on a CPU)."""
    then = _read(sidecar(results)).get("runtime")
    if not isinstance(then, dict):
        return None
    differs = [f"{k} {then[k]} then, {runtime[k]} now" for k in runtime if k in then and then[k] != runtime[k]]
    return (f"{results}: the earlier rows were made on another runtime ({'; '.join(differs)}): their answers may "
            "differ from this run's (--overwrite redoes them)") if differs else None


def refuse_other_penalty(results: Path, now: float | None) -> None:
    """A UsageError when ``results``' rows were decoded with another repetition penalty than ``now`` (the one this
    run's engine applies; None: not known). vlmfast 0.14 and earlier recorded none, and their own decode loop
    applied none, whatever the checkpoint's generation config said."""
    from vlmfast.files import holds_rows  # rows in --out, or in a parallel run's part files

    record = _read(sidecar(results))
    then = (record.get("runtime") or {}).get("repetition_penalty")
    settings = record.get("settings") or {}
    if then is None and record and "repetition_penalty" not in (settings.get("generation") or {}) \
            and settings.get("engine", "hf") == "hf":
        then = 1.0
    if then is not None and now is not None and float(then) != float(now) and holds_rows(results):
        raise UsageError(f"{results} holds rows decoded with repetition penalty {float(then):g}; this run applies "
                         f"{float(now):g} (the checkpoint's generation config, or --repetition-penalty)",
                         hint=f"rerun with --overwrite to redo them, or --repetition-penalty {float(then):g} to go on as "
                              "they were made")


def measured(results: Path) -> dict:
    """The figures recorded when ``results``' rows were generated ({} without a record)."""
    try:
        return json.loads(sidecar(results).read_text(encoding="utf-8")).get("figures", {})
    except (OSError, ValueError):
        return {}


def recorded_path(results: Path) -> str | None:
    """The checkpoint directory ``results``' rows were made from, as its record names it (None: older records)."""
    path = _read(sidecar(results)).get("path")
    return path if isinstance(path, str) else None


def gone_steps(out_dir: Path, listed: set[int], only: tuple[int, ...] | None, run_dir=None) -> list[tuple[int, Path]]:
    """(step, results file) of the steps a sweep into ``out_dir`` finished earlier (their record holds the
    figures of the run) whose checkpoint the run no longer lists, nor skips (its folder is gone); within
    ``only`` (``--steps``) when given. Only a checkpoint of ``run_dir`` (its record names it) that no longer
    exists: another run's steps in the same ``--out-dir`` are not this run's."""
    import re

    gone = []
    for out in sorted(Path(out_dir).glob("step-*.jsonl")):
        m = re.fullmatch(r"step-(\d+)\.jsonl", out.name)
        step = int(m.group(1)) if m else None
        if step is None or step in listed or (only is not None and step not in only) or not measured(out):
            continue
        if run_dir is not None and not _deleted_from(recorded_path(out), Path(run_dir)):
            continue
        gone.append((step, out))
    return sorted(gone)


def _deleted_from(path: str | None, run_dir: Path) -> bool:
    """Whether ``path`` (a recorded checkpoint directory) was in ``run_dir`` and is there no more."""
    if path is None:
        return False
    try:
        Path(path).resolve().relative_to(run_dir.resolve())
    except ValueError:
        return False
    return not Path(path).exists()


def recorded_seed(results: list[Path]) -> int | None:
    """The sampling seed recorded beside the first of ``results`` whose run recorded one (None: none did)."""
    for path in results:
        try:
            seed = json.loads(sidecar(path).read_text(encoding="utf-8"))["settings"]["generation"]["seed"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(seed, int) and not isinstance(seed, bool):
            return seed
    return None


def fingerprint_figures(weights_id: dict | None) -> dict:
    """What a record keeps of the weights' fingerprint: its digest, and what it covers where it says (an adapter's:
    with its base's weights, or its base's name only)."""
    return {"fingerprint": weights_id["digest"] if weights_id else None,
            **({"fingerprint_of": weights_id["of"]} if weights_id and "of" in weights_id else {})}


def same_digest(then: str, weights_id: dict) -> bool:
    """Whether a recorded fingerprint ``then`` is of the weights ``weights_id`` fingerprints now: its digest, or the
    one vlmfast 0.17 and earlier recorded for the same adapter (before adapter_config.json's settings counted)."""
    return then in (weights_id["digest"], weights_id.get("digest_before_0_18"))


def refuse_other_weights(results: Path, weights_id: dict | None, settings: dict | None = None) -> None:
    """A UsageError when ``results``' rows were made from weights other than the checkpoint's now (its record
    holds another fingerprint): resuming would mix the answers of two models in one file. It says why — another
    checkpoint named (the recorded ``ckpt`` is not ``settings``' one) or the same checkpoint's files changed — and
    names the other ``settings`` that differ too, so that one rerun finds every difference."""
    from vlmfast.files import holds_rows  # rows in --out, or in a parallel run's part files

    try:
        record = json.loads(sidecar(results).read_text(encoding="utf-8"))
        then = record.get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return
    now = weights_id["digest"] if weights_id else None
    if then is not None and now is not None and not same_digest(then, weights_id) and holds_rows(results):
        made_from, evaluates = _source(record), (settings or {}).get("ckpt")
        other = _other_checkpoint(made_from, evaluates)
        differs = [d for d in setting_differences(record, settings or {}) if not (other and d.startswith("ckpt: "))]
        why = (f"they were made from {made_from} and this run evaluates {evaluates}" if other
               else "the checkpoint's weight files changed since")
        raise UsageError(f"{results} holds rows made from other weights: {why} (fingerprint {then} then, {now} now)"
                         + ("; and other settings: " + "; ".join(differs)) * bool(differs),
                         hint="rerun with --overwrite to redo them with these weights, or give another --out")


def forget_if_changed(results: Path, weights_id: dict | None, path=None) -> str | None:
    """When ``results``' rows were made from other weights than the checkpoint's at ``path`` now (its record
    holds another fingerprint), move the rows and the record aside (a ``replaced-<time>`` folder) so the step is
    evaluated again, and say why: the rows were made from another checkpoint (the record names another path),
    or the checkpoint's weight files changed since."""
    record = _read(sidecar(results))
    then = record.get("fingerprint")
    now = weights_id["digest"] if weights_id else None
    if then is None or now is None or same_digest(then, weights_id):
        return None
    aside = move_aside(results.parent, [p for p in (results, sidecar(results)) if p.is_file()])
    made_from = _source(record)
    why = (f"its rows were made from {made_from} and this run evaluates {path}" if _other_checkpoint(made_from, path)
           else "the checkpoint's weight files changed since its rows were written")
    return f"{results.name}: {why} (fingerprint {then} then, {now} now): evaluated again (the earlier rows are in {aside})"


def _source(record: dict) -> str | None:
    """The checkpoint a record's rows were made from: a sweep's ``path``, or infer's ``ckpt`` setting (None: older
    records name neither)."""
    source = record.get("path") or (record.get("settings") or {}).get("ckpt")
    return source if isinstance(source, str) else None


def _other_checkpoint(then, now) -> bool:
    """Whether ``then`` and ``now`` (paths or hub ids; None: not known) name different checkpoints: neither the
    same text nor the same folder once resolved."""
    if then is None or now is None or str(then) == str(now):
        return False
    return Path(then).resolve() != Path(now).resolve()


def _norm(value):
    return json.loads(json.dumps(value, default=str))


def _differences(name: str, then, now) -> list[str]:
    """Each setting that differs, as "name: then-value then, now-value now"; settings that are groups
    (``generation``) are compared member by member, so the line names what changed (``generation.n``)."""
    if isinstance(then, dict) and isinstance(now, dict):
        return [line for key in dict.fromkeys([*then, *now])
                for line in _differences(f"{name}.{key}", then.get(key), now.get(key))]
    return [] if then == now else [f"{name}: {_show(then)} then, {_show(now)} now"]


def _show(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "…"


def same_weights_notes(figures: list[dict]) -> list[str]:
    """Checkpoints whose weights are identical (equal fingerprints): a trainer that saved the same weights
    under two steps, or a copy — their figures differ by noise only."""
    steps: dict[str, list[int]] = {}
    for f in figures:
        if f.get("fingerprint"):
            steps.setdefault(f["fingerprint"], []).append(f["step"])
    return [f"steps {', '.join(map(str, sorted(s)))} have identical weights (fingerprint {digest}): the same model "
            "saved twice, or a copy" for digest, s in steps.items() if len(s) > 1]


def manifest_state(manifest) -> dict | None:
    """What a resume needs to tell whether ``manifest`` changed: its digest, and a file's size (None: no manifest)."""
    if not manifest or not Path(manifest).exists():
        return None
    path = Path(manifest)
    return {"sha256": _digest(path), "bytes": path.stat().st_size if path.is_file() else None}


def manifest_unchanged(results: Path, manifest) -> bool:
    """Whether ``manifest`` is the one ``results``' rows were made from, or that one with lines appended (a file
    whose first bytes are the recorded ones): a record's own manifest state, or a sweep's digest in its settings."""
    record = _read(sidecar(Path(results)))
    then = record.get("manifest") if isinstance(record.get("manifest"), dict) else {}
    digest = then.get("sha256") or (record.get("settings") or {}).get("manifest_sha256")
    path = Path(manifest)
    if not digest:
        return False
    size = then.get("bytes")
    if not isinstance(size, int) or not path.is_file() or path.stat().st_size < size:
        return _digest(path) == digest
    h = hashlib.sha256()
    with path.open("rb") as f:
        while size > 0 and (block := f.read(min(1 << 20, size))):
            h.update(block)
            size -= len(block)
    return h.hexdigest()[:len(digest)] == digest  # recorded as _digest shortens it


def remember_manifest(results: Path, state: dict) -> None:
    """Record ``state`` (:func:`manifest_state`) as the manifest ``results``' rows now answer."""
    from vlmfast.files import atomic_write

    data = _read(sidecar(Path(results)))
    if data:
        data["manifest"] = state
        atomic_write(sidecar(Path(results)), (json.dumps(data, indent=1, default=str) + "\n").encode("utf-8"))
