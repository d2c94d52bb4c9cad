"""Trainer datasets on disk, read with pyarrow a record batch at a time: parquet files (one, or a folder of
sorted shards) and ``datasets.save_to_disk`` folders (Arrow IPC stream files, read memory-mapped).

Images embedded in a row (``{"bytes", "path"}`` structs, as the ``datasets`` Image feature stores them, or
raw bytes) are never copied out of the file for the whole run: a scan reads one record batch at a time
(their headers are checked and dropped), and a request keeps an :class:`EmbeddedImage` — where its bytes
lie — that :func:`fetch_bytes` reads again when its batch is prepared, one record batch at a time. So the
memory a scan or a fetch takes does not grow with the file's row count.

Random access to a parquet row streams its row group's image column up to that row: trainer-written
files (``datasets``' ``to_parquet`` writes 100 rows per row group for image data) make that cheap; a file
written as one huge row group is read again, page by page, for every batch that needs one of its rows.
Besides the record batch, pyarrow's reader holds one data page (and a row group's dictionary page when
the writer dictionary-encoded the images): their size is the writer's choice, not the row count's.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vlmfast.errors import InputError, UsageError

BATCH_ROWS = 64  # rows per record batch read: the most image bytes held at once is one batch's
PARQUET_BUFFER_BYTES = 1 << 20  # stream a column chunk page by page instead of reading it whole
PYARROW_HINT = 'pip install "vlmfast[parquet]" (or: pip install "pyarrow>=15")'


def require_pyarrow():
    """The pyarrow module, or a UsageError that says how to install it."""
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise UsageError("reading parquet or Arrow (save_to_disk) manifests needs pyarrow", hint=PYARROW_HINT) from None
    return pyarrow


@dataclass(frozen=True)
class Part:
    """One file of a dataset: ``kind`` is "parquet" or "arrow" (an IPC stream, as ``save_to_disk`` writes)."""

    path: str
    kind: str


@dataclass(frozen=True)
class EmbeddedImage:
    """Where one embedded image's bytes lie: the file, the chunk (a parquet row group, an Arrow record
    batch, or for ``kind`` "tsv" the byte offset of the row holding the base64), the row within it, the image
    column and the image's position in the row's list (None: the column holds one image, not a list)."""

    path: str
    kind: str
    chunk: int
    offset: int
    column: str
    index: int | None


def dataset_parts(path: str) -> list[Part]:
    """The files of a dataset at ``path``: a ``.parquet`` or ``.arrow`` file; a folder of parquet shards
    (sorted by name); a ``save_to_disk`` folder (``state.json`` lists its arrow files in order)."""
    p = Path(path)
    if p.is_file():
        kind = "arrow" if p.suffix == ".arrow" else "parquet"
        return [Part(str(p), kind)]
    if not p.is_dir():
        raise InputError(f"cannot read manifest {path}: no such file or folder", hint="check the path")
    if (p / "dataset_dict.json").is_file():
        splits = sorted(d.name for d in p.iterdir() if (d / "state.json").is_file())
        raise UsageError(f"{path} is a DatasetDict (splits: {', '.join(splits) or 'none'})",
                         hint=f"give one split's folder, e.g. --manifest {p / (splits[0] if splits else 'test')}")
    if (p / "state.json").is_file():
        try:
            files = [f["filename"] for f in json.loads((p / "state.json").read_text(encoding="utf-8"))["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(f"cannot read {p / 'state.json'}: {exc}", hint="give a folder datasets' save_to_disk wrote") from exc
        return [Part(str(p / f), "arrow") for f in files]
    shards = sorted(f for f in os.listdir(p) if f.endswith(".parquet"))
    if not shards:
        raise InputError(f"{path} holds no .parquet files and no save_to_disk dataset (state.json)",
                         hint="give a .jsonl / .parquet file, a folder of parquet shards or a save_to_disk folder")
    return [Part(str(p / f), "parquet") for f in shards]


def column_names(part: Part) -> list[str]:
    """The top-level columns of a file, read from its schema only."""
    pa = require_pyarrow()
    if part.kind == "parquet":
        return list(pa.parquet.ParquetFile(part.path).schema_arrow.names)
    with pa.memory_map(part.path) as source:
        return list(pa.ipc.open_stream(source).schema.names)


def record_batches(part: Part, columns: list[str] | None = None) -> Iterator[tuple[int, int, object]]:
    """``(chunk, first row in the chunk, record batch)`` for the file, at most :data:`BATCH_ROWS` rows a
    batch (an Arrow file's own batches: memory-mapped, they are views of the file, not copies)."""
    pa = require_pyarrow()
    try:
        if part.kind == "parquet":
            pf = pa.parquet.ParquetFile(part.path, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
            for group in range(pf.num_row_groups):
                start = 0
                for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns, use_threads=False):
                    yield group, start, batch
                    start += batch.num_rows
            return
        with pa.memory_map(part.path) as source:
            for chunk, batch in enumerate(pa.ipc.open_stream(source)):
                yield chunk, 0, batch.select(columns) if columns is not None else batch
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read {part.path}: {exc}",
                         hint="give a parquet file or a datasets save_to_disk folder (Arrow IPC stream files)") from exc


def image_entries(value) -> list:
    """An image column's value as a list of images, each ``bytes`` (embedded), a ``str`` (a path) or
    None (neither): the ``{"bytes", "path"}`` struct of ``datasets``' Image feature (its bytes win, as the
    trainers decode them; verl also reads ``{"image": path}``), raw bytes, a path, or a list of these."""
    items = value if isinstance(value, list) else ([] if value is None else [value])
    out = []
    for item in items:
        if isinstance(item, dict):
            item = item.get("bytes") or item.get("path") or item.get("image")
        out.append(item if isinstance(item, (bytes, str)) and item else None)
    return out


def top_column(key: str, names: list[str]) -> str:
    """The top-level column holding ``key``: itself, or for a dotted key (``media.picture``) its struct."""
    return key if key in names else key.split(".", 1)[0]


def key_values(batch, key: str):
    """The values of ``key`` in a record batch: a column, or a dotted key's field reached through its
    struct columns (a null struct gives a null value); None when the batch has neither."""
    names = batch.schema.names
    if key in names:
        return batch.column(key)
    top, *fields = key.split(".")
    if top not in names or not fields:
        return None
    import pyarrow.compute as pc

    return pc.struct_field(batch.column(top), fields)


def fetch_bytes(refs: list[EmbeddedImage]) -> dict[EmbeddedImage, bytes]:
    """The bytes of every image in ``refs``: each chunk they lie in read once, a record batch at a time
    (only the image column), stopping after the last row wanted; nothing else is kept."""
    wanted: dict[tuple, list[EmbeddedImage]] = defaultdict(list)
    for ref in refs:
        wanted[(ref.path, ref.kind, ref.column, ref.chunk)].append(ref)
    found: dict[EmbeddedImage, bytes] = {}
    for (path, kind, column, chunk), mine in wanted.items():
        last = max(r.offset for r in mine)
        for start, batch in _chunk_batches(Part(path, kind), chunk, column):
            values = key_values(batch, column)
            for ref in mine:
                if start <= ref.offset < start + batch.num_rows:
                    entries = image_entries(values[ref.offset - start].as_py())  # this row's images only
                    data = entries[ref.index or 0] if len(entries) > (ref.index or 0) else None
                    if not isinstance(data, bytes):
                        raise InputError(f"{path}: row {ref.offset} of chunk {chunk} no longer holds image "
                                         f"{ref.index or 0}", hint="the file changed since the run started")
                    found[ref] = data
            if start + batch.num_rows > last:
                break
    return found


def _chunk_batches(part: Part, chunk: int, column: str) -> Iterator[tuple[int, object]]:
    """``(first row, batch)`` of one chunk's ``column`` (a dotted key's whole top-level column): a parquet row
    group streamed, or the Arrow file's ``chunk``-th record batch (the stream walked to it, memory-mapped)."""
    pa = require_pyarrow()
    if part.kind == "parquet":
        pf = pa.parquet.ParquetFile(part.path, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
        start, top = 0, top_column(column, pf.schema_arrow.names)
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[chunk], columns=[top], use_threads=False):
            yield start, batch
            start += batch.num_rows
        return
    with pa.memory_map(part.path) as source:
        for k, batch in enumerate(pa.ipc.open_stream(source)):
            if k == chunk:
                yield 0, batch.select([top_column(column, batch.schema.names)])
                return


def image_label(part: Part, row: int, index: int | None) -> str:
    """What a result row's ``images`` shows for an embedded image: stable across runs (resume and sweeps
    key on it), e.g. ``data/test.parquet#row=12/image=0`` (the row counted from the file's start)."""
    return f"{part.path}#row={row}/image={index or 0}"
