"""Optimisers for kiln.compile_training (docs/training.md). Each is only a
description: the compiler writes its update into the training package,
with PyTorch's (and optax's) meaning of every number."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Optimizer:
    learning_rate: float

    kind = ""

    def numbers(self) -> dict:
        return {key: float(value) for key, value in asdict(self).items()}


@dataclass(frozen=True)
class SGD(Optimizer):
    """w -= learning_rate * v, v = momentum * v + (g + weight_decay * w)
    (v = the gradient term when momentum is 0)."""
    momentum: float = 0.0
    weight_decay: float = 0.0
    kind = "sgd"


@dataclass(frozen=True)
class Adam(Optimizer):
    """Adam with L2 weight decay added to the gradient (torch.optim.Adam)."""
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.0
    kind = "adam"


@dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay (torch.optim.AdamW, optax.adamw)."""
    weight_decay: float = 0.01
    kind = "adamw"
