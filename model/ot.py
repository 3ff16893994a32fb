"""Batched IPOT (inexact proximal point optimal transport, Xie et al. 2018) for WRA.

IPOT solves min_T <T, C> over plans with uniform marginals by proximal steps with a KL
(Bregman) penalty of strength ``beta`` towards the previous plan. Each outer iteration multiplies
the plan by exp(-C / beta) and rescales it towards the marginals with ``inner_steps`` Sinkhorn-like
updates; unlike Sinkhorn the result converges to the *unregularized* optimum, which is why UNITER
uses it (no entropic bias to tune). UNITER's setting: beta = 0.5, 50 iterations, 1 inner step.

Padding: a padded word/region gets zero marginal mass, so its row/column of the plan stays zero and
examples of different lengths share one batched computation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["IPOT_BETA", "IPOT_INNER_STEPS", "IPOT_ITERATIONS", "cosine_cost", "ipot", "ot_distance"]

# UNITER's IPOT setting: the defaults of every function that runs IPOT (here and in model/heads/wra.py)
IPOT_BETA = 0.5
IPOT_ITERATIONS = 50
IPOT_INNER_STEPS = 1


def cosine_cost(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cosine distance 1 - cos(x_i, y_j): x [B, n, H], y [B, m, H] -> [B, n, m] in [0, 2]."""
    return 1.0 - torch.bmm(F.normalize(x, dim=-1, eps=1e-8), F.normalize(y, dim=-1, eps=1e-8).transpose(1, 2))


@torch.no_grad()
def ipot(
    cost: torch.Tensor,
    x_mask: torch.Tensor,
    y_mask: torch.Tensor,
    *,
    beta: float = IPOT_BETA,
    iterations: int = IPOT_ITERATIONS,
    inner_steps: int = IPOT_INNER_STEPS,
) -> torch.Tensor:
    """Approximate optimal transport plans for a batch of cost matrices (no gradient).

    Args:
        cost: [B, n, m] cost matrices (computed in float32 whatever the input dtype).
        x_mask: bool [B, n], True = real row (mass 1 / #real rows); y_mask: bool [B, m] likewise.
        beta: proximal (KL) step strength; iterations: outer proximal steps; inner_steps: marginal
            rescalings per outer step.
    Returns:
        plan [B, n, m] float32, zero on padded rows/columns; sums to 1 per example, rows sum to
        1/#real rows exactly after the last update (the x side is rescaled last, as in UNITER),
        columns approximately (within ~1e-3 for UNITER's setting on costs in [0, 2]).
    """
    if cost.dim() != 3 or x_mask.shape != cost.shape[:2] or y_mask.shape != (cost.shape[0], cost.shape[2]):
        raise ValueError(
            f"ipot: expected cost [B, n, m], x_mask [B, n], y_mask [B, m]; got {tuple(cost.shape)}, "
            f"{tuple(x_mask.shape)}, {tuple(y_mask.shape)}"
        )
    cost = cost.float()
    x_valid, y_valid = x_mask.float(), y_mask.float()
    a = x_valid / x_valid.sum(1, keepdim=True).clamp_min(1.0)  # row marginals [B, n]
    b = y_valid / y_valid.sum(1, keepdim=True).clamp_min(1.0)  # column marginals [B, m]
    joint = x_valid.unsqueeze(2) * y_valid.unsqueeze(1)
    kernel = torch.exp(-cost / beta).mul_(joint)
    plan = joint  # the initial plan: ones on the real block
    row_scale = x_valid.clone()  # its scale cancels in the first column update
    tiny = torch.finfo(torch.float32).tiny
    for _ in range(iterations):
        plan.mul_(kernel)  # Q = exp(-C / beta) * T, in place: this loop is memory-bound
        for _ in range(inner_steps):
            # UNITER's order (model/ot.py there, x = words, y = regions): the y (region) side first,
            # the x (word) side last, so the x marginals are the exact ones
            col_scale = b / torch.bmm(row_scale.unsqueeze(1), plan).squeeze(1).clamp_min(tiny)
            row_scale = a / torch.bmm(plan, col_scale.unsqueeze(2)).squeeze(2).clamp_min(tiny)
        plan.mul_(row_scale.unsqueeze(2)).mul_(col_scale.unsqueeze(1))  # T = diag(row) Q diag(col)
    return plan


def ot_distance(
    x: torch.Tensor,
    y: torch.Tensor,
    x_mask: torch.Tensor,
    y_mask: torch.Tensor,
    *,
    beta: float = IPOT_BETA,
    iterations: int = IPOT_ITERATIONS,
    inner_steps: int = IPOT_INNER_STEPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OT distance between two padded point sets under the cosine cost.

    The plan is found without gradient (detached, as in UNITER); the distance <T, C> is then
    differentiable with respect to ``x`` and ``y`` through the cost.

    Args:
        x [B, n, H], y [B, m, H]; x_mask bool [B, n], y_mask bool [B, m] (True = real).
    Returns:
        (distance f32 [B], plan f32 [B, n, m]).
    """
    cost = cosine_cost(x.float(), y.float())
    plan = ipot(cost.detach(), x_mask, y_mask, beta=beta, iterations=iterations, inner_steps=inner_steps)
    return (cost * plan).sum(dim=(1, 2)), plan
