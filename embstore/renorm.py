"""``max_norm``: rows renormalised as ``torch.nn.functional.embedding`` does.

torch's ``embedding_renorm_`` scales a row whose ``norm_type``-norm exceeds ``max_norm``
by ``max_norm / (norm + 1e-7)``, the scale in double and the product in the row's own
precision.  Rounding the scale and the products still leaves about 1 row in 300 a unit
in the last place above the limit (a float32 norm reads 1.0000001 for 1.0), which
torch's own tests (``norm <= max_norm``) would catch: such rows are nudged below it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["renorm"]


def renorm(flat: np.ndarray, max_norm: float, norm_type: float) -> None:
    """Scale the rows of the 2-D ``flat`` (in place) whose norm exceeds ``max_norm``."""
    work = flat.astype(np.float32) if flat.dtype == np.float16 else flat
    p = norm_type
    if p == 2.0:
        norms = np.sqrt(np.einsum("ij,ij->i", work, work))
    else:
        norms = np.linalg.norm(work, ord=p, axis=1)
    big = norms > max_norm
    if big.any():
        factor = max_norm / (norms[big].astype(np.float64) + 1e-7)
        rows = (work[big] * factor[:, None].astype(work.dtype)).astype(flat.dtype)
        if rows.dtype != np.float64:
            _below(rows, max_norm, p)
        flat[big] = rows


def _below(rows: np.ndarray, limit: float, p: float) -> None:
    """Nudge renormalised float32/float16 ``rows`` (in place) until their norm, exact and
    computed in their own precision, is at most ``limit``: rounding the scale and the
    products leaves some rows 1 ulp above (a float32 ``norm`` then reads 1.0000001 for
    1.0); such rows lose 1 ulp per element per round (at most 8 rounds: rows start
    within a few ulps)."""
    for _ in range(8):
        over = (np.linalg.norm(rows.astype(np.float64), ord=p, axis=1) > limit) | \
            (np.linalg.norm(rows, ord=p, axis=1) > limit)  # exact, and in their precision
        if not over.any():
            return
        rows[over] = np.nextafter(rows[over], rows.dtype.type(0))
