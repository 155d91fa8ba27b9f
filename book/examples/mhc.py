"""Doubly-stochastic residual mixing, the projection of mHC (a sidebar: architecture, not RL).

mHC, *Manifold-Constrained Hyper-Connections* (DeepSeek-AI, arXiv 2512.24880), is a change to
the residual connection, unrelated to DeepSeek-V3.2's RL recipe and to Monte Carlo sampling.
Hyper-Connections widen the residual stream to ``n`` parallel streams mixed by a learned
``H_res [n, n]`` per layer; across depth the product ``H_res^L ... H_res^1`` replaces the
identity of a plain residual connection and, unconstrained, can blow up or vanish. mHC projects
every ``H_res`` onto the doubly-stochastic matrices (the Birkhoff polytope: non-negative, every
row and column summing to 1) with Sinkhorn-Knopp, starting from ``exp`` of the raw matrix and
alternating column and row normalisation for ``t_max = 20`` iterations. Doubly-stochastic
matrices have spectral norm 1 and are closed under products, so the composite mixing over any
depth stays non-expansive. Where we depart from the paper: these details come from secondary
accounts of it, whose equation numbers we could not verify, so none are cited here.

Math only: this module imports torch and the package's argument checks.
"""

from __future__ import annotations


import torch
from torch import Tensor

from grpo_lab.algo.checks import float_tensor, positive_int

__all__ = ["sinkhorn_knopp", "product_gain", "GAIN_KINDS"]

#: what :func:`product_gain` measures
GAIN_KINDS = ("spectral", "max_row_sum", "max_col_sum")


def _square(x, name: str) -> Tensor:
    float_tensor(x, name)
    if x.dim() < 2 or x.shape[-1] != x.shape[-2] or x.shape[-1] < 1:
        raise ValueError(f"{name} must have shape [..., n, n] with n >= 1, got {tuple(x.shape)}")
    return x


def sinkhorn_knopp(x: Tensor, iters: int = 20, *, positive: bool = False) -> Tensor:
    """Sinkhorn-Knopp projection of ``x [..., n, n]`` onto the doubly-stochastic matrices.

    ``positive=False`` (mHC's use): ``x`` holds unconstrained logits and the iteration starts
    from ``M0 = exp(x)``. ``positive=True``: ``x`` is already a non-negative matrix ``M0``.
    Each iteration normalises the columns, then the rows, ``M <- T_r(T_c(M))``; after ``iters``
    iterations rows sum to 1 exactly (up to rounding) and columns approximately, converging
    geometrically for a positive ``M0``. How fast depends on the spread of the logits: with
    mHC's 20 iterations, the worst column sum over 200 random 4x4 matrices of Gaussian logits was
    within ~4e-6 of 1 for standard deviation 1 but ~1e-2 for standard deviation 2 (~2e-7 after 200
    iterations). The result has the form ``D1 M0 D2`` (positive diagonal
    ``D1``, ``D2``), so scaling the rows or columns of ``M0`` (adding per-row or per-column
    constants to the logits) does not change the limit.

    Computed in log space (``logsumexp``) in float32 (float64 for float64 input), so large
    logits neither overflow nor underflow; differentiable, batched over leading dimensions.

    Args:
        x: ``[..., n, n]`` logits, or a non-negative matrix when ``positive=True``.
        iters: number of column+row normalisation rounds, ``>= 1`` (mHC: 20).
        positive: whether ``x`` is a non-negative matrix instead of logits.

    Returns:
        ``[..., n, n]`` non-negative matrices with rows (and, to the convergence tolerance,
        columns) summing to 1, dtype float32 (float64 for float64 input).

    Raises:
        ValueError: wrong shape or dtype, ``iters < 1``, NaN / inf in ``x`` (``+inf`` logits or
            entries), a negative entry or an all-zero row or column with ``positive=True``.
    """
    x = _square(x, "x")
    positive_int("iters", iters)
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    v = x.to(cdt)
    if not bool(torch.isfinite(v).all()):
        raise ValueError("sinkhorn_knopp: x must be finite (no NaN or inf)")
    if positive:
        if bool((v < 0).any()):
            raise ValueError("sinkhorn_knopp: with positive=True every entry must be >= 0")
        if bool(((v > 0).sum(dim=-1) == 0).any()) or bool(((v > 0).sum(dim=-2) == 0).any()):
            raise ValueError(
                "sinkhorn_knopp: an all-zero row or column cannot be scaled to sum to 1")
        log_m = torch.log(v)  # zeros -> -inf, which logsumexp handles
    else:
        log_m = v
    for _ in range(int(iters)):
        log_m = log_m - torch.logsumexp(log_m, dim=-2, keepdim=True)  # columns
        log_m = log_m - torch.logsumexp(log_m, dim=-1, keepdim=True)  # rows
    return torch.exp(log_m)


def product_gain(matrices: Tensor, kind: str = "spectral") -> float:
    """Gain of the depth-composite mixing ``P = H_L @ ... @ H_1`` of ``matrices [L, n, n]``.

    ``matrices[l]`` is layer ``l``'s residual mixing (applied in order ``0, 1, ..., L-1``, so
    ``P = matrices[L-1] @ ... @ matrices[0]``). ``kind``:

    * ``"spectral"`` — the largest singular value of ``P`` (worst-case growth of a vector's
      Euclidean norm);
    * ``"max_row_sum"`` — ``max_i sum_j |P_ij|`` (the infinity-norm: forward signal gain);
    * ``"max_col_sum"`` — ``max_j sum_i |P_ij|`` (the 1-norm: backward gradient gain, since the
      backward pass goes through ``P^T``).

    All three are exactly 1 for a product of doubly-stochastic matrices, and can grow or shrink
    exponentially with depth for unconstrained ones. mHC reports an "Amax gain" of this kind
    (about 3000 for unconstrained HC at 27B, about 1.6 for mHC); its exact definition was only
    read from secondary sources, so no kind here claims to be it.

    Raises:
        ValueError: shape not ``[L, n, n]`` with ``L >= 1``, non-finite entries, unknown kind.
    """
    if kind not in GAIN_KINDS:
        raise ValueError(f"unknown gain kind {kind!r}; expected one of {GAIN_KINDS}")
    mats = _square(matrices, "matrices")
    if mats.dim() != 3 or mats.shape[0] < 1:
        raise ValueError(f"matrices must have shape [L, n, n] with L >= 1, got {tuple(mats.shape)}")
    m = mats.detach().to(torch.float64)
    if not bool(torch.isfinite(m).all()):
        raise ValueError("product_gain: matrices must be finite (no NaN or inf)")
    p = m[0]
    for layer in m[1:]:
        p = layer @ p
    if kind == "spectral":
        g = torch.linalg.matrix_norm(p, ord=2)
    elif kind == "max_row_sum":
        g = p.abs().sum(dim=-1).max()
    else:
        g = p.abs().sum(dim=-2).max()
    return float(g)
