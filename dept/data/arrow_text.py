"""A source's text in Arrow files, read by plain reads so memory does not follow its size.

``datasets`` memory-maps its Arrow files: every page a pass over the text touches stays in
the process's resident memory for as long as the table lives, so one pass over a 2 GB
source leaves 2 GB resident. Here files are read record batch by record batch through
``pyarrow.ipc.open_stream(pyarrow.OSFile(...))``: the page cache holds the text, the
process one batch. A split is chosen once as row numbers of the table ``datasets`` built
(:func:`scan` drops blank rows; :meth:`Rows.take` holds documents out; :meth:`Rows.capped`
applies ``max-train-bytes``) and :func:`write` puts those rows, in the split's order, in a
file of their own, so every later pass (the tokenizer sample, the tokenization) reads one
file front to back with :func:`batches`.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TEXT = "text"
RECORD_BYTES = 8_000_000  # text per record batch written: few headers, small reads
BUCKET_BYTES = 32_000_000  # text per bucket when rows are written in a shuffled order
# The characters str.isspace() knows: a row holding only these is blank (as str.strip() says).
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
NOT_WHITESPACE = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in WHITESPACE) + "]"  # RE2
TEXT_TYPES = (pa.string(), pa.large_string())


class NotTextError(ValueError):
    """A text column holding other values: ``found`` is the first one's Python type."""

    def __init__(self, found: str, row: int) -> None:
        super().__init__(f"{found} values (row {row})")
        self.found, self.row = found, row


def columns(table: datasets.Dataset, column: str = TEXT, start: int = 0) -> Iterator[pa.Array]:
    """``column`` of ``table`` from row ``start`` on, in pieces as they lie.

    A table in Arrow files must be those files row for row (a table ``datasets`` built, or
    one :func:`write` wrote), not a view of them: the files are read, not the view.
    """
    files = [Path(f["filename"]) for f in table.cache_files]
    if not files:  # in memory: nothing is mapped, datasets' own slices do
        arrow = table.with_format("arrow")
        for at in range(start, len(table), 1 << 16):
            yield arrow[at : at + (1 << 16)][column].combine_chunks()
        return
    skip = start
    for path in files:
        with pa.OSFile(str(path)) as source:
            for batch in pa.ipc.open_stream(source):
                if skip >= batch.num_rows:
                    skip -= batch.num_rows
                    continue
                yield batch.column(column).slice(skip)
                skip = 0


def batches(table: datasets.Dataset, start: int, rows: int) -> Iterator[pa.Array]:
    """The ``text`` of ``table`` from row ``start``, ``rows`` rows at a time (the last fewer)."""
    pending: list[pa.Array] = []
    held = 0
    for piece in columns(table, TEXT, start):
        pending.append(piece)
        held += len(piece)
        while held >= rows:
            joined = pa.concat_arrays(pending)
            yield joined.slice(0, rows)
            pending, held = [joined.slice(rows)], held - rows
    if held:
        yield pa.concat_arrays(pending)


@dataclass(frozen=True)
class Rows:
    """Rows of ``table`` a split takes, in the split's order, and their size."""

    table: datasets.Dataset  # as ``datasets`` built it (its files are its rows), or in memory
    column: str
    ids: np.ndarray  # (n,) row numbers in ``table``
    sizes: np.ndarray  # (n,) UTF-8 bytes of each row's text

    def take(self, positions: np.ndarray) -> Rows:
        return Rows(self.table, self.column, self.ids[positions], self.sizes[positions])

    def capped(self, max_bytes: int) -> Rows:
        """The first rows before the one reaching ``max_bytes`` of text in all (at least
        one; 0 = no cap)."""
        if not max_bytes:
            return self
        cut = int(np.searchsorted(np.cumsum(self.sizes), max_bytes))
        return self.take(np.arange(max(1, cut)))


def scan(table: datasets.Dataset, column: str, keep_blank: bool = False) -> Rows:
    """The rows of ``table`` whose ``column`` holds non-blank text (any text where
    ``keep_blank``), in order, read once.

    Raises :class:`NotTextError` for a column of other values (a null is no text).
    """
    field_type = table.data.schema.field(column).type
    if field_type not in (*TEXT_TYPES, pa.null()):
        raise _first_non_text(table, column)
    n = len(table)  # filled in place, compact: 8 bytes a row, not copies of 16
    ids = np.empty(n, np.uint32 if n < 1 << 32 else np.int64)
    sizes = np.empty(n, np.int64 if field_type == pa.large_string() else np.int32)
    kept_rows = start = 0
    for piece in columns(table, column):
        if start + len(piece) > n:
            raise ValueError(f"{table.cache_files} hold more than the table's {n} rows")
        text = piece.cast(pa.string()) if piece.type == pa.null() else piece
        keep = pc.is_valid(text) if keep_blank else pc.match_substring_regex(text, NOT_WHITESPACE)
        kept = np.flatnonzero(pc.fill_null(keep, False).to_numpy(zero_copy_only=False))
        lengths = pc.fill_null(pc.binary_length(text), 0).to_numpy()
        ids[kept_rows : kept_rows + len(kept)] = kept + start
        sizes[kept_rows : kept_rows + len(kept)] = lengths[kept]
        kept_rows, start = kept_rows + len(kept), start + len(piece)
    if start != n:
        raise ValueError(f"{table.cache_files} hold {start} rows, the table {n}")
    return Rows(table, column, ids[:kept_rows], sizes[:kept_rows])


def _first_non_text(table: datasets.Dataset, column: str) -> NotTextError:
    """The first value that is neither text nor null, decoded as ``datasets`` reads it."""
    values = table.select_columns([column])
    for start in range(0, len(values), 1000):
        for row, value in enumerate(values[start : start + 1000][column], start):
            if value is not None and not isinstance(value, str):
                return NotTextError(type(value).__name__, row)
    return NotTextError(str(table.features[column]), 0)


def held_out(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) positions among ``n`` rows, as ``datasets``'
    ``train_test_split(test_size=fraction, seed=seed, shuffle=True)`` draws them."""
    n_val = math.ceil(fraction * n)
    if n_val >= n:
        raise ValueError(
            f"holding out {fraction} of {n} documents leaves none to train on; "
            "lower 'val-fraction' or add documents"
        )
    order = np.random.default_rng(seed).permutation(n)
    return order[n_val:], order[:n_val]


def write(rows: Rows, path: Path) -> None:
    """Write ``rows``' text, in their order, to the Arrow stream file ``path`` (atomically)."""
    tmp = path.with_name(f".{path.name}.tmp")
    field_type = rows.table.data.schema.field(rows.column).type
    schema = pa.schema([(TEXT, field_type)])
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, schema) as out:
        if np.all(rows.ids[1:] > rows.ids[:-1]):
            _write_in_order(rows, out)
        else:
            _write_shuffled(rows, out, field_type, path.parent)
    tmp.replace(path)


def _write_in_order(rows: Rows, out: pa.ipc.RecordBatchStreamWriter) -> None:
    """Rows in increasing order: one pass, each piece's chosen rows taken as it is read."""
    start, taken = 0, []
    for piece in columns(rows.table, rows.column):
        lo, hi = np.searchsorted(rows.ids, [start, start + len(piece)])
        taken.append(piece.take(rows.ids[lo:hi] - start))
        start += len(piece)
        if sum(t.nbytes for t in taken) >= RECORD_BYTES:
            _write_sized(out, pa.concat_arrays(taken))
            taken = []
    if taken:
        _write_sized(out, pa.concat_arrays(taken))


def _write_sized(out: pa.ipc.RecordBatchStreamWriter, texts: pa.Array) -> None:
    """``texts`` in record batches of about :data:`RECORD_BYTES`."""
    rows = max(1, int(len(texts) * RECORD_BYTES / max(1, texts.nbytes)))
    for at in range(0, len(texts), rows):
        out.write_batch(pa.record_batch([texts.slice(at, rows)], [TEXT]))


def _write_shuffled(
    rows: Rows, out: pa.ipc.RecordBatchStreamWriter, field_type: pa.DataType, scratch: Path
) -> None:
    """Rows in any order, without reading the table at random: one pass sorts the rows
    into buckets of consecutive output positions (files on disk, about
    :data:`BUCKET_BYTES` each); each bucket is then read whole and put in order."""
    per_bucket = max(1, int(len(rows.ids) * BUCKET_BYTES / max(1, int(rows.sizes.sum()))))
    position = np.full(len(rows.table), -1, np.int64)
    position[rows.ids] = np.arange(len(rows.ids))
    schema = pa.schema([("position", pa.int64()), (TEXT, field_type)])
    with tempfile.TemporaryDirectory(dir=scratch, prefix=".buckets-") as tmp:
        buckets = [Path(tmp) / f"{b}.arrow" for b in range(-(-len(rows.ids) // per_bucket))]
        sinks = [pa.OSFile(str(b), "wb") for b in buckets]
        writers = [pa.ipc.new_stream(s, schema) for s in sinks]
        start = 0
        for piece in columns(rows.table, rows.column):
            at = position[start : start + len(piece)]
            wanted = np.flatnonzero(at >= 0)
            for b in np.unique(at[wanted] // per_bucket):
                mine = wanted[at[wanted] // per_bucket == b]
                writers[b].write_batch(pa.record_batch([at[mine], piece.take(mine)], schema))
            start += len(piece)
        for writer, sink in zip(writers, sinks, strict=True):
            writer.close()
            sink.close()
        for bucket in buckets:
            with pa.OSFile(str(bucket)) as source:
                table = pa.ipc.open_stream(source).read_all()
            order = pc.sort_indices(table["position"])
            _write_sized(out, table[TEXT].take(order).combine_chunks())
            bucket.unlink()
