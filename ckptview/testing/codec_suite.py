"""``CodecSuite``: the checks every codec must pass, for a codec's tests to subclass.

A subclass names the codec and gives good sample files; every ``test_*`` method then runs on
them (pytest collects the subclass like any test class)::

    class TestToy(CodecSuite):
        codec = "toy"
        def make_samples(self, directory):
            return [write_toy(directory / "a.toy")]
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import fsspec
import numpy as np

from .. import registry
from ..dtypes import np_dtype
from ..io import Storage
from ..model import FileRef
from ..scan.listing import FileResult, list_file
from .mutations import flipped, truncation_points


class CodecSuite:
    """Listing vs reading, byte bounds, truncation at every header offset, bad input."""

    #: the codec's registered name
    codec: ClassVar[str] = ""
    #: good sample files (absolute paths); or override :meth:`make_samples`
    samples: ClassVar[tuple[str, ...]] = ()
    #: False for codecs only layouts assign (never detected from a file's bytes)
    detected: ClassVar[bool] = True
    #: truncation offsets: every one below this, then ``truncations`` more
    truncate_every_below: ClassVar[int] = 1024
    truncations: ClassVar[int] = 24
    #: a file above 64 KiB is listed from at most max(16 KiB, size // this) bytes
    header_fraction: ClassVar[int] = 8

    def make_samples(self, directory: Path) -> list[Path]:
        """Good files of the format (``directory``: a fresh temporary directory)."""
        return [Path(p) for p in self.samples]

    # -- helpers ----------------------------------------------------------------------------
    def _samples(self, tmp_path: Path) -> list[Path]:
        made = self.make_samples(tmp_path / "samples")
        assert made, f"{type(self).__name__}: no sample files"
        return made

    def _list(self, path: Path) -> tuple[FileResult, Storage]:
        storage = _local()
        res = list_file(storage, 0, FileRef(str(path), codec=self.codec))
        return res, storage

    # -- the checks -------------------------------------------------------------------------
    def test_registered(self) -> None:
        assert registry.get_codec(self.codec).name == self.codec

    def test_claims_its_samples(self, tmp_path: Path) -> None:
        if not self.detected:
            return
        for path in self._samples(tmp_path):
            blob = _local().blob(str(path))
            got = registry.detect_codec(path.name, blob.head() if blob.size else b"", blob)
            assert got is not None and got.name == self.codec, (path.name, got)

    def test_listing_follows_the_contract(self, tmp_path: Path) -> None:
        for path in self._samples(tmp_path):
            res, _ = self._list(path)
            assert res.error is None, (path.name, res.error)
            assert res.variables, f"{path.name}: no variables"
            for var in res.variables:
                assert all(type(d) is int and d >= 0 for d in var.shape), var
                assert var.numel == int(np.prod(var.shape, dtype=np.int64)), var
                if var.dtype != "object" and var.error is None:
                    np_dtype(var.dtype)

    def test_listing_reads_headers_only(self, tmp_path: Path) -> None:
        for path in self._samples(tmp_path):
            size = path.stat().st_size
            res, storage = self._list(path)
            got = storage.counters.bytes_read
            assert got <= size, f"{path.name}: read {got} bytes of {size}"
            if size > 64 << 10:
                bound = max(16 << 10, size // self.header_fraction)
                assert got <= bound, f"{path.name}: listing read {got} of {size} bytes"

    def test_reading_matches_listing(self, tmp_path: Path) -> None:
        codec = registry.get_codec(self.codec)
        for path in self._samples(tmp_path):
            res, storage = self._list(path)
            blob = storage.blob(str(path))
            for var in res.variables:
                if var.error or var.dtype == "object":
                    continue
                arr = np.asarray(codec.read(blob, var))
                assert arr.shape == tuple(var.shape), (var.name, arr.shape, var.shape)
                assert arr.dtype == np_dtype(var.dtype), (var.name, arr.dtype, var.dtype)
                pieces = list(codec.iter_chunks(blob, var, max_bytes=1 << 12))
                flat = np.concatenate([p.reshape(-1) for p in pieces]) if pieces else arr
                np.testing.assert_array_equal(flat, arr.reshape(-1), err_msg=var.name)

    def test_truncation_at_every_header_offset(self, tmp_path: Path) -> None:
        """A cut copy never crashes a listing, never reads past its end, and whatever it
        still lists without error lies inside it."""
        for path in self._samples(tmp_path):
            data = path.read_bytes()
            cut = tmp_path / "cut" / path.name
            cut.parent.mkdir(parents=True, exist_ok=True)
            for n in truncation_points(len(data), self.truncate_every_below, self.truncations):
                cut.write_bytes(data[:n])
                res, storage = self._list(cut)
                assert storage.counters.bytes_read <= n, (path.name, n)
                for var in res.variables:
                    span = var.span
                    if var.error is None and span is not None and span.path == str(cut):
                        assert span.offset + span.length <= n, (path.name, n, var.name)

    def test_bad_input_is_an_error_row(self, tmp_path: Path) -> None:
        """Flipped header bytes and garbage under the sample's name: a result, never a crash;
        garbage is an error."""
        for path in self._samples(tmp_path):
            bad = tmp_path / "bad" / path.name
            bad.parent.mkdir(parents=True, exist_ok=True)
            for i, data in enumerate(flipped(path.read_bytes(), n=8)):
                bad.write_bytes(data)
                assert isinstance(self._list(bad)[0], FileResult), (path.name, i)
            bad.write_bytes(b"\xff" * min(4096, max(path.stat().st_size, 64)))
            res, _ = self._list(bad)
            assert res.error or all(v.error for v in res.variables), (path.name, res)


def _local() -> Storage:
    return Storage(fsspec.filesystem("file"))
