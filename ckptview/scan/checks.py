"""Checksums checked as a tree is read, where they are few bytes and the framework checks them.

TensorFlow's reader checks every entry's crc32c and ``np.load`` every ``.npz`` member's
CRC-32 on each load: a flipped bit makes the serial fail to load, yet no header shows it.
ckptview reads headers only; for these formats, when every file a listed file's values lie in
is at most :data:`SMALL_CHECK` bytes (the first read of a remote file: its bytes are in hand
anyway), the checksums are checked as the serials' verdicts are formed, so ``loadable`` is the
framework's own answer without a deep verify. Larger files keep their header verdict
(``verify(deep=True)`` reads them). What was found is kept in the header cache under the
identities of every file of the serial (like a deep verify's findings): with the shared or a
disk cache a reopened tree reads nothing again. The check costs one whole-file read of each
such file on first open. A read that fails (a file deleted meanwhile, a store's error) leaves
the file on its header verdict and is not remembered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .. import registry
from ..codecs.base import Codec
from ..formats.zipdir import LOCAL_MAGIC, crc_problems
from ..io import Storage
from ..model import as_columns
from ..tree import Tree
from .cache import HeaderCache, deep_key
from .listing import FileResult

#: the largest file whose checksums are checked as the tree is read (bytes)
SMALL_CHECK = 64 << 10


#: errors of a read, not of the bytes: the file keeps its header verdict, nothing is kept
TRANSIENT = (OSError, TimeoutError)


def checksum_problems(storage: Storage, res: FileResult, codec: Codec, *, any_zip: bool = False,
                      silent: bool = False, chunk: int = 4 << 20,
                      transient: tuple[type[BaseException], ...] = TRANSIENT,
                      ) -> Iterator[tuple[str, str, str]]:  # fmt: skip
    """``(check, severity, message)`` for each checksum of a listed file its bytes fail: the
    CRC-32 of its members when it is a zip archive (its codec's files are, or ``any_zip``:
    whatever the codec; ``silent``: the framework loads them unchecked, see
    :func:`~ckptview.formats.zipdir.crc_problems`), read ``chunk`` bytes at a time, and the
    format's own (:meth:`Codec.checksums`). Errors of the ``transient`` kinds (a read that
    failed, not the bytes) are raised; deep verify passes none and reports them."""
    blob = storage.blob(res.ref.path, res.ref.size)
    if (codec.zip_archive or any_zip) and blob.size >= 4 and blob.head(4) == LOCAL_MAGIC:
        for severity, message in crc_problems(blob, silent, chunk, transient):
            yield "crc32", severity, message
    try:
        for name, problem in codec.checksums(blob, res.variables):
            yield "checksum", "error", f"{name}: {problem}"
    except transient:
        raise
    except Exception as e:  # noqa: BLE001 - a checksum that cannot be read is the finding
        yield "checksum", "error", f"checksum unreadable: {type(e).__name__}: {e}"


def _data_paths(storage: Storage, res: FileResult, codec: Codec) -> Iterator[str]:
    """The files a listed file's values lie in: a columnar listing's ``paths`` column (and its
    rows read through a locator), else each variable's spans (None: its own file)."""
    columns = as_columns(res.variables)
    if columns is not None:
        others = columns.others or {}
        if columns.paths is None:
            yield columns.path
        else:  # a row read through a locator: its own spans below
            yield from dict.fromkeys(p for i, p in enumerate(columns.paths) if i not in others)
        variables = list(others.values())
    else:
        variables = res.variables
    blob = storage.blob(res.ref.path, res.ref.size)
    for var in variables:
        if var.error:
            continue
        spans = codec.spans(blob, var)
        for path, _offset, _length in spans if spans is not None else [(res.ref.path, 0, 0)]:
            yield path


def _files(storage: Storage, res: FileResult, codec: Codec) -> dict[str, int] | None:
    """The files a listed file's checks read (its own when it is a zip archive, and those its
    values lie in), with their sizes; None at the first one larger than
    :data:`SMALL_CHECK` (a large checkpoint is not walked further)."""
    out: dict[str, int] = {}
    if codec.zip_archive:
        out[res.ref.path] = storage.blob(res.ref.path, res.ref.size).size
    for path in _data_paths(storage, res, codec):
        if path not in out:
            out[path] = storage.blob(path).size
        if not 0 <= out[path] <= SMALL_CHECK:
            return None
    return out or None


def small_checks(tree: Tree, storage: Storage, cache: HeaderCache,
                 results: list[FileResult],
                 serial_paths: Callable[[], dict[int, list[str]]]) -> dict[int, list[str]]:  # fmt: skip
    """Per serial: the checksum errors of its small files whose framework checks them on
    load (codecs with ``checked_on_load``), as ``file: check: message``; serials without any
    are left out. Files are checked concurrently on remote storage, each fetched whole."""
    todo: list[tuple[FileResult, Codec, dict[str, int]]] = []
    for res in results:
        if not res.codec or res.error or not res.ref.required or not res.variables:
            continue
        try:
            codec = registry.get_codec(res.codec)
        except Exception:  # noqa: BLE001 - an unknown codec has nothing to check
            continue
        if not codec.checked_on_load:
            continue
        try:
            files = _files(storage, res, codec)
        except Exception:  # noqa: BLE001 - a file that cannot be sized keeps its header verdict
            continue
        if files is not None:
            todo.append((res, codec, files))
    if not todo:
        return {}
    paths = serial_paths()
    # a private cache defers its first stores (a catalog opened once): not forced here
    lookups = not (cache.private and cache.pending)
    found: dict[int, list[str]] = {}
    missing = []
    for res, codec, files in todo:
        key = deep_key(cache, tree, res.ref.path, paths.get(res.serial, []), kind="checked")
        got = cache.get(key) if lookups else None
        if got is None:
            missing.append((res, codec, files, key))
        elif got:
            found.setdefault(res.serial, []).extend(got)

    def check(item: tuple) -> list[str] | None:
        res, codec, _files, _key = item
        name = res.ref.path.rsplit("/", 1)[-1]
        try:
            return [f"{name}: {kind}: {message}"
                    for kind, severity, message in checksum_problems(storage, res, codec)
                    if severity == "error"]  # fmt: skip
        except TRANSIENT:  # not checked: its header verdict stands, nothing is remembered
            return None

    def whole(item: tuple) -> list[tuple[Storage, str, int]]:
        return [(storage, path, size) for path, size in item[2].items() if size > 0]

    for item, problems in zip(missing, storage.map_window(check, missing, files=whole,
                                                          inline=lambda _: True)):  # fmt: skip
        if problems is None:
            continue
        key = item[3]
        if cache.private:
            cache.defer(lambda key=key, problems=problems: cache.put(key, problems))
        else:
            cache.put(key, problems)
        if problems:
            found.setdefault(item[0].serial, []).extend(problems)
    return found
