"""Names of globals that frameworks' safe loaders add for some files (no import cost: the
layouts name them when they hand a file to its codec)."""

from __future__ import annotations

#: what transformers allows in ``rng_state*.pth`` (``safe_globals`` of numpy's RNG state)
NUMPY_RNG_GLOBALS = frozenset({
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray",
    "numpy.dtype", "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
    "numpy.dtypes.UInt32DType", "numpy.dtypes.Float64DType", "numpy.dtypes.Int64DType",
})  # fmt: skip
