"""The Bradley-Terry preference objective and its metrics; pure tensor code, no I/O.

Under Bradley-Terry, P(chosen beats rejected) = sigmoid(r_chosen - r_rejected), so the reward
model is fitted by maximising the log-likelihood of the human (here: programmatic) choices. Only
differences of rewards enter, so the scores are identified up to a constant: a reward read from
the model has no natural zero, which is why consumers compare scores rather than threshold them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bt_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Mean of -log sigmoid(r_chosen - r_rejected) over pairs; (N,), (N,) -> ().

    `logsigmoid` rather than `log(sigmoid(.))` so a confidently wrong pair (a large negative
    margin) still gives a finite loss and a gradient.
    """
    return -F.logsigmoid(chosen - rejected).mean()


def pairwise_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> float:
    """Share of pairs with r_chosen > r_rejected, a tie counting half; (N,), (N,) -> float.

    Counting ties as half makes a model that scores everything alike exactly chance (0.5), not
    0, so the accuracy before training is an honest baseline.
    """
    if chosen.numel() == 0:
        raise ValueError("no pairs to score")
    wins = (chosen > rejected).float() + 0.5 * (chosen == rejected).float()  # (N,)
    return float(wins.mean())


def preference_probability(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """P(chosen preferred) under the model; (N,), (N,) -> (N,)."""
    return torch.sigmoid(chosen - rejected)
