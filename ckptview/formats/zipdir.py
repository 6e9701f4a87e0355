"""Zip archives read by ranges: the one zip reader of every zip-based format.

torch.save archives, ``.npz`` and ``.keras`` files all go through here: the end of central
directory record (zip64 aware) comes from a short read of the file's tail, the central
directory from one ranged read, and the local headers of the wanted members (with the first
bytes of their data, when asked) from one batch. Bytes inside the Blob's cached first block
are served from it, so a small archive costs one read. Nothing here trusts a size field: every
offset is checked against the file's size before anything is read or allocated.

**Aligned archives** (PyTorchStreamWriter): every record's payload starts at the next multiple
of the archive's alignment (64 by default, the ``.storage_alignment`` record) past its local
header, the extra field being padded to get there (``FB`` + ``Z``s; ``getPadding`` in
PyTorch's ``caffe2/serialize/inline_container.cc``). :func:`aligned_offset` predicts that
offset from the central directory alone and :func:`packed` says whether the directory agrees
with it (each record is followed by the next one, or the directory, right after its payload
and data descriptor), so a reader need not fetch one local header per record; a prediction is
still checked against the local header when the record is read (:func:`header_check`), the
header coming in the same ranged read as the payload.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from ..io import HEAD_BLOCK, Blob, TruncatedError

STORED, DEFLATED = 0, 8
LOCAL_MAGIC = b"PK\x03\x04"
_EOCD = b"PK\x05\x06"
_EOCD64 = b"PK\x06\x06"
_LOCATOR64 = b"PK\x06\x07"
_CENTRAL = b"PK\x01\x02"
_TAILS = (1024, 22 + 65535 + 20)  # a short tail first: most writers add no archive comment


@dataclass(frozen=True)
class ZipEntry:
    """One member from the central directory (the ZipInfo fields the codecs use)."""

    filename: str
    header_offset: int
    compress_size: int
    file_size: int
    compress_type: int
    CRC: int
    flag_bits: int
    name_len: int  # raw length of the name, and of the central extra field: the local
    extra_len: int  # header usually repeats both, so they size a first read of it
    base: int = 0  # bytes before the archive (a self-extracting stub): offsets include them

    def is_dir(self) -> bool:
        return self.filename.endswith("/")


class Directory(dict[str, ZipEntry]):
    """name -> :class:`ZipEntry`, in directory order; ``cd_start``: where the central directory
    begins (the end of the last record)."""

    cd_start: int = 0


class Seen:
    """Byte ranges of one file read already, for a later reader of the same bytes (the Keras
    codec's h5py child reads the archive again after its directory was parsed)."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, bytes]] = []

    def add(self, at: int, data: bytes) -> None:
        if data:
            self.spans.append((at, data))

    def read(self, blob: Blob, start: int, length: int) -> bytes:
        """``length`` bytes at ``start``: held ones from here, only the gaps from the file."""
        out, pos, end = bytearray(), start, start + length
        while pos < end:
            hit = next(((a, d) for a, d in self.spans if a <= pos < a + len(d)), None)
            if hit is not None:
                piece = hit[1][pos - hit[0] : end - hit[0]]
            else:
                stop = min((a for a, _ in self.spans if pos < a < end), default=end)
                piece = blob.read(pos, stop - pos)
            out += piece
            pos += len(piece)
        return bytes(out)


def read_ranges(blob: Blob, ranges: list[tuple[int, int]], seen: Seen | None = None) -> list[bytes]:
    """Bytes ``[a, b)`` for each range: the part in the cached first block from it, the rest
    in one batch (recorded in ``seen``). TruncatedError for a range outside the file."""
    size = blob.size
    first = min(HEAD_BLOCK, size)
    out: list[bytes] = []
    todo: list[tuple[int, int]] = []
    where: list[int] = []
    for i, (a, b) in enumerate(ranges):
        if a < 0 or b < a or b > size:
            raise TruncatedError(f"{blob.name}: needs bytes {a}..{b} but the file has {size}")
        if a < first:
            head = blob.head()
            out.append(head[a : min(b, first)])
            if b <= first:
                continue
            a = first
        else:
            out.append(b"")
        todo.append((a, b))
        where.append(i)
    if todo:
        got = blob.read_ranges(todo)
        for i, (a, b), data in zip(where, todo, got, strict=True):
            if len(data) < b - a:
                raise TruncatedError(f"{blob.name}: the file ended while reading it")
            out[i] += data
    if seen is not None:
        for (a, _), data in zip(ranges, out, strict=True):
            seen.add(a, data)
    return out


def read(blob: Blob, offset: int, length: int, seen: Seen | None = None) -> bytes:
    """``length`` bytes at ``offset``, from the cached first block where they lie in it."""
    return read_ranges(blob, [(offset, offset + length)], seen)[0]


def read_directory(blob: Blob, seen: Seen | None = None) -> Directory:
    """The members of a zip archive, in directory order (a repeated name: the last one)."""
    size = blob.size
    if size < 22:
        raise ValueError(f"{blob.name}: not a zip archive (too short)")
    tail, at = b"", -1
    for want in _TAILS:
        n = min(size, want)
        tail = read(blob, size - n, n - len(tail), seen) + tail  # only the bytes not read yet
        at = tail.rfind(_EOCD)
        if at >= 20 or n == size:
            break
    if at < 0 or at + 22 > len(tail):
        raise ValueError(f"{blob.name}: not a zip archive (no end of central directory)")
    tail_at = size - len(tail)
    eocd_pos = tail_at + at
    n_total, cd_size, cd_offset = struct.unpack_from("<HII", tail, at + 10)
    loc = at - 20
    has_locator = loc >= 0 and tail[loc : loc + 4] == _LOCATOR64
    if has_locator or n_total == 0xFFFF or 0xFFFFFFFF in (cd_size, cd_offset):
        if not has_locator:
            raise ValueError(f"{blob.name}: zip64 archive without its locator")
        (eocd_pos,) = struct.unpack_from("<Q", tail, loc + 8)
        if eocd_pos + 56 > tail_at + loc:
            raise ValueError(f"{blob.name}: bad zip64 end of central directory offset")
        if eocd_pos >= tail_at:
            rec = tail[eocd_pos - tail_at : eocd_pos - tail_at + 56]
        else:
            rec = read(blob, eocd_pos, 56, seen)
        if rec[:4] != _EOCD64:
            raise ValueError(f"{blob.name}: bad zip64 end of central directory")
        wide = struct.unpack_from("<QQQ", rec, 32)
        for short, full, cap in zip(
            (n_total, cd_size, cd_offset), wide, (0xFFFF, *[0xFFFFFFFF] * 2)
        ):
            if short not in (cap, full):  # a saturated field defers to zip64; others agree
                raise ValueError(f"{blob.name}: zip and zip64 end records disagree")
        n_total, cd_size, cd_offset = wide
    # bytes prepended to the archive (self-extracting stubs) shift every offset, as zipfile
    concat = eocd_pos - cd_size - cd_offset
    if concat < 0 or n_total > cd_size // 46 + 1:
        raise TruncatedError(
            f"{blob.name}: zip central directory at {cd_offset}+{cd_size} beyond {eocd_pos}"
        )
    cd_start = cd_offset + concat
    if cd_start >= tail_at:  # the directory is in the tail already read
        cd = tail[cd_start - tail_at : cd_start - tail_at + cd_size]
    elif cd_start + cd_size > tail_at:
        cd = read(blob, cd_start, tail_at - cd_start, seen) + tail[: cd_start + cd_size - tail_at]
    else:
        cd = read(blob, cd_start, cd_size, seen)
    out = Directory()
    out.cd_start = cd_start
    spans: list[tuple[int, int, str]] = []
    pos = 0
    for _ in range(n_total):
        if pos + 46 > len(cd) or cd[pos : pos + 4] != _CENTRAL:
            raise ValueError(f"{blob.name}: corrupt zip central directory")
        flags, method, crc, csize, usize, nlen, xlen, clen = struct.unpack_from(
            "<HH4xIIIHHH", cd, pos + 8
        )
        (offset,) = struct.unpack_from("<I", cd, pos + 42)
        if pos + 46 + nlen + xlen + clen > len(cd):
            raise ValueError(f"{blob.name}: corrupt zip central directory")
        raw = cd[pos + 46 : pos + 46 + nlen]
        name = raw.decode("utf-8" if flags & 0x800 else "cp437", "replace")
        extra = cd[pos + 46 + nlen : pos + 46 + nlen + xlen]
        usize, csize, offset = _zip64_extra(extra, usize, csize, offset)
        out[name] = ZipEntry(
            name, offset + concat, csize, usize, method, crc, flags, nlen, xlen, concat
        )
        spans.append((offset + concat, offset + concat + 30 + nlen + csize, name))
        pos += 46 + nlen + xlen + clen
    _refuse_overlaps(blob, spans, cd_start)
    return out


def _refuse_overlaps(blob: Blob, spans: list[tuple[int, int, str]], cd_start: int) -> None:
    """Members must not share bytes, nor run into the directory: CPython's zipfile refuses
    "overlapped entries" (the trick of zip bombs whose entries reuse one local header)."""
    spans.sort()
    for (_a, end, name), (b, _end, other) in zip(spans, spans[1:]):
        if b < end:
            raise ValueError(
                f"{blob.name}: zip members {name!r} and {other!r} overlap (bytes {b}..{end})"
            )
    if spans and spans[-1][1] > cd_start:
        raise ValueError(f"{blob.name}: zip member {spans[-1][2]!r} runs into the directory")


def _zip64_extra(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    i = 0
    while i + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, i)
        if tag == 1:
            body = extra[i + 4 : i + 4 + n]
            vals = list(struct.unpack(f"<{len(body) // 8}Q", body[: len(body) // 8 * 8]))
            if usize == 0xFFFFFFFF and vals:
                usize = vals.pop(0)
            if csize == 0xFFFFFFFF and vals:
                csize = vals.pop(0)
            if offset == 0xFFFFFFFF and vals:
                offset = vals.pop(0)
        i += 4 + n
    return usize, csize, offset


def locate(
    blob: Blob, entries: list[ZipEntry], peek: int = 0, seen: Seen | None = None
) -> list[tuple[int, bytes] | Exception]:
    """Per member: (offset of its stored bytes, their first ``min(peek, compress_size)``
    bytes), from its local header, or the exception saying why it cannot be located.

    All local headers (and peeks) come in one batch; a local extra field longer than the
    central one costs a second batch for the missing peeks only.
    """
    size = blob.size
    ranges = []
    for e in entries:
        want = 30 + (e.name_len + e.extra_len + min(peek, e.compress_size) if peek else 0)
        ranges.append((e.header_offset, min(e.header_offset + want, size)))
    got = read_ranges(blob, [(a, max(a, b)) for a, b in ranges], seen) if ranges else []
    out: list[tuple[int, bytes] | Exception] = []
    missing: list[tuple[int, int, int]] = []  # (index, start, end) of peeks to complete
    for i, (e, data) in enumerate(zip(entries, got, strict=True)):
        if len(data) < 30 or data[:4] != LOCAL_MAGIC:
            out.append(ValueError(f"zip member {e.filename}: bad local header"))
            continue
        nlen, xlen = struct.unpack_from("<HH", data, 26)
        start = e.header_offset + 30 + nlen + xlen
        if start + e.compress_size > size:
            out.append(TruncatedError(f"zip member {e.filename} runs past the end of the file"))
            continue
        want = min(peek, e.compress_size)
        have = data[30 + nlen + xlen : 30 + nlen + xlen + want]
        out.append((start, have))
        if len(have) < want:
            missing.append((i, start + len(have), start + want))
    if missing:
        more = read_ranges(blob, [(a, b) for _, a, b in missing], seen)
        for (i, _, _), data in zip(missing, more, strict=True):
            start, have = out[i]  # type: ignore[misc]
            out[i] = (start, have + data)
    return out


# -- aligned archives (PyTorchStreamWriter) ---------------------------------------------------
DEFAULT_ALIGNMENT = 64
_U32 = 0xFFFFFFFF


def aligned_offset(e: ZipEntry, alignment: int = DEFAULT_ALIGNMENT) -> int:
    """Where PyTorchStreamWriter puts a record's payload: past the local header, its name, the
    padding field's own 4 bytes and (sizes or offset >= 4 GiB) the zip64 field, rounded up to
    ``alignment`` -- ``getPadding`` of ``inline_container.cc``."""
    at = e.header_offset - e.base  # the writer counts from the start of its archive
    start = at + 30 + e.name_len + 4
    if e.file_size >= _U32 or at >= _U32:
        start += 4 + (16 if e.file_size >= _U32 else 0) + (8 if at >= _U32 else 0)
    return e.base + -(-start // alignment) * alignment


def packed(directory: Directory, alignment: int = DEFAULT_ALIGNMENT) -> set[str]:
    """Names of the stored records whose predicted payload (:func:`aligned_offset`) ends right
    where the directory says the next record (or the directory) starts, past a data descriptor
    when the record has one: what PyTorchStreamWriter writes. A record written otherwise
    (another extra field, compression, a gap) fails the test."""
    order: list[ZipEntry] = sorted(directory.values(), key=lambda e: e.header_offset)
    ends = [e.header_offset for e in order[1:]] + [directory.cd_start]
    out = set()
    for e, nxt in zip(order, ends, strict=True):
        if e.compress_type != STORED or e.compress_size != e.file_size:
            continue
        if directory.get(e.filename) is not e:  # a name repeated: the earlier one is hidden
            continue
        gap = nxt - (aligned_offset(e, alignment) + e.compress_size)
        if gap in ((16, 24) if e.flag_bits & 8 else (0,)):
            out.add(e.filename)
    return out


def header_check(e: ZipEntry, header: bytes) -> int:
    """The exact payload offset of ``e`` from its local header's first ``30 + name_len`` (or
    more) bytes; ValueError when they are not ``e``'s local header."""
    if len(header) < 30 + e.name_len or header[:4] != LOCAL_MAGIC:
        raise ValueError(f"zip member {e.filename}: bad local header")
    nlen, xlen = struct.unpack_from("<HH", header, 26)
    raw = header[30 : 30 + nlen]
    name = raw.decode("utf-8" if e.flag_bits & 0x800 else "cp437", "replace")
    if nlen != e.name_len or name != e.filename:
        raise ValueError(f"zip member {e.filename}: local header names {name!r}")
    return e.header_offset + 30 + nlen + xlen


def read_members(
    blob: Blob, entries: list[ZipEntry], limit: int, alignment: int = DEFAULT_ALIGNMENT
) -> list[tuple[int, bytes]]:
    """Per member: (exact payload offset, its first ``min(limit, size)`` bytes), headers and
    payloads together: one request when the members lie close together (as torch's small
    records do), sized by :func:`aligned_offset` and completed by a second batch only for a
    member whose local header is longer than predicted."""
    size = blob.size
    ranges = []
    for e in entries:
        if e.header_offset < 0 or e.header_offset + 30 > size:
            raise TruncatedError(f"zip member {e.filename} lies beyond the end of the file")
        want = aligned_offset(e, alignment) + min(limit, e.compress_size)
        ranges.append((e.header_offset, min(max(want, e.header_offset + 30 + e.name_len), size)))
    lo, hi = min(a for a, _ in ranges), max(b for _, b in ranges)
    if hi - lo <= sum(b - a for a, b in ranges) + (64 << 10):  # close together: one read
        hull = read_ranges(blob, [(lo, hi)])[0]
        got = [hull[a - lo : b - lo] for a, b in ranges]
    else:
        got = read_ranges(blob, ranges)
    out: list[tuple[int, bytes]] = []
    missing = []
    for i, (e, (a, _), data) in enumerate(zip(entries, ranges, got, strict=True)):
        start = header_check(e, data)
        if start + e.compress_size > size:
            raise TruncatedError(f"zip member {e.filename} runs past the end of the file")
        want = min(limit, e.compress_size)
        have = data[start - a : start - a + want]
        out.append((start, have))
        if len(have) < want:
            missing.append((i, start + len(have), start + want))
    if missing:
        more = read_ranges(blob, [(a, b) for _, a, b in missing])
        for (i, _, _), data in zip(missing, more, strict=True):
            out[i] = (out[i][0], out[i][1] + data)
    return out


def crc_problems(blob: Blob, silent: bool = False, chunk: int = 4 << 20,
                 transient: tuple[type[BaseException], ...] = ()) -> Iterator[tuple[str, str]]:  # fmt: skip
    """``(severity, message)`` for each member whose CRC-32 (stored and deflated members)
    its bytes fail, or that does not inflate, streamed in ``chunk``-byte reads; ``silent``:
    the framework's reader loads a corrupt member without noticing (torch: a storage's bytes
    are still an error, any other member a warning). Errors of the ``transient`` kinds (a
    read that failed, not the bytes) are raised, not reported."""
    said = " (torch would load it silently)" if silent else ""
    try:
        directory = read_directory(blob)
        entries = [e for e in directory.values()
                   if e.compress_type in (STORED, DEFLATED) and e.file_size]  # fmt: skip
        starts = locate(blob, entries)
    except transient:
        raise
    except Exception as err:  # noqa: BLE001 - the listing reported what it could not read
        yield "error", f"zip directory: {type(err).__name__}: {err}"
        return
    for member, where in zip(entries, starts, strict=True):
        if isinstance(where, Exception):
            yield "error", f"{member.filename}: {where}"
            continue
        try:
            crc = member_crc(blob, member, where[0], chunk)
        except transient:
            raise
        except Exception as e:  # noqa: BLE001 - a member that does not inflate is the finding
            yield "error", f"{member.filename}: CRC-32 unchecked: {e}{said}"
            continue
        if crc != member.CRC:
            severity = "warning" if silent and "/data/" not in member.filename else "error"
            yield severity, f"{member.filename}: CRC-32 {crc:08x} != {member.CRC:08x}{said}"


def member_crc(blob: Blob, member: ZipEntry, start: int, chunk: int = 4 << 20) -> int:
    """The CRC-32 of a member's uncompressed bytes, streamed in bounded memory (on remote
    storage the next chunks read while one is summed: ``Blob.read_many``)."""
    crc = 0
    size = member.file_size if member.compress_type == STORED else member.compress_size
    chunks = blob.read_many((start + at, min(chunk, size - at)) for at in range(0, size, chunk))
    if member.compress_type == STORED:
        for data in chunks:
            crc = zlib.crc32(data, crc)
        return crc
    inflate, n = zlib.decompressobj(-15), 0
    for raw in chunks:
        data = inflate.decompress(raw, chunk)
        while True:
            crc, n = zlib.crc32(data, crc), n + len(data)
            if not inflate.unconsumed_tail:
                break
            data = inflate.decompress(inflate.unconsumed_tail, chunk)
    if not inflate.eof or n != member.file_size:
        raise ValueError(f"the compressed stream ends early ({n} of {member.file_size} bytes)")
    return crc
