"""Spectral statistics of a 2-D weight: ``sigma_max`` and WeightWatcher's power-law ``alpha``.

The power-law exponent ``alpha`` is fitted as WeightWatcher does (its own ``WW_powerlaw``
fit): the eigenvalues of WᵀW (λ = σ² of W, ``min(rows, cols)`` of them), without numerical
zeros (λ ≤ 1e-10·λ_max), sorted; for every candidate ``xmin`` (each eigenvalue but the
largest) the continuous power-law MLE over the tail λ ≥ xmin, α = 1 + n / Σ ln(λ/xmin)
(Clauset, Shalizi & Newman 2009), and the Kolmogorov–Smirnov distance between the tail's
empirical CDF (i/n, i = 0…n−1) and the fitted 1 − (λ/xmin)^(1−α); the fit with the smallest
distance wins. No ``xmax``; fewer than :data:`MIN_EVALS` eigenvalues give NaN.
"""

from __future__ import annotations

import math

import numpy as np

#: the largest matrix (values) whose spectrum is computed: 2**24 = 4096 x 4096 (128 MiB f64)
SPECTRAL_MAX_NUMEL = 1 << 24
MIN_EVALS = 10  # fewer eigenvalues: no alpha (WeightWatcher skips small layers too)


def fit_alpha(evals: np.ndarray) -> tuple[float, float, float]:
    """(alpha, xmin, KS distance) of the eigenvalues' tail, as WeightWatcher fits it (see the
    module docstring); NaNs when there are too few eigenvalues."""
    x = np.asarray(evals, dtype=np.float64).reshape(-1)
    x = x[np.isfinite(x)]
    if x.size:
        x = np.sort(x[x > 1e-10 * x.max()])
    n = x.size
    if n < MIN_EVALS:
        return math.nan, math.nan, math.nan
    logs = np.log(x)
    tail_logs = np.cumsum(logs[::-1])[::-1]  # sum of logs[i:]
    best = (math.inf, math.nan, math.nan)
    for i in range(n - 1):
        m = n - i
        s = tail_logs[i] - m * logs[i]
        if s <= 0:
            continue
        alpha = 1.0 + m / s
        fitted = 1.0 - np.exp((1.0 - alpha) * (logs[i:] - logs[i]))
        d = float(np.max(np.abs(fitted - np.arange(m) / m)))
        if d < best[0]:
            best = (d, alpha, float(x[i]))
    return best[1], best[2], best[0]


def spectral_stats(w: np.ndarray) -> dict:
    """``sigma_max`` and ``alpha`` of a 2-D matrix (NaN for non-finite values)."""
    w = np.asarray(w, dtype=np.float64)
    if not np.isfinite(w).all():
        return {"sigma_max": math.nan, "alpha": math.nan, "note": "spectral: non-finite values"}
    sv = np.linalg.svd(w, compute_uv=False)
    alpha = fit_alpha(sv * sv)[0] if sv.size else math.nan
    return {"sigma_max": float(sv[0]) if sv.size else math.nan, "alpha": alpha}
