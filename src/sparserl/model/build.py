"""The policy a training stage starts from: a policy checkpoint, a Hugging Face model folder wrapped
in a new policy, or (no model there) an error that says how to get one."""

from __future__ import annotations

import dataclasses
import logging

import torch

from sparserl.model.policy import Policy, PolicyConfig

log = logging.getLogger(__name__)


def build_policy(path: str, config: PolicyConfig, device: torch.device | str, *, seed: int = 0,
                 card: bool | None = None) -> Policy:
    """The policy at ``path`` to train further: a checkpoint as it was saved, or a HF model folder
    wrapped with ``config``. Seeded by ``seed`` (the matrix encoder's initial weights), so runs that
    differ in one setting (the card ablation) start from the same weights.

    ``card``: None keeps a checkpoint's own card setting (a new policy takes ``config.card``);
    True or False sets it, with a warning when a checkpoint was trained the other way."""
    torch.manual_seed(seed)
    policy = Policy.open(path, config, device=str(device))
    if card is not None and policy.config.card != card:
        log.warning("%s was trained %s the matrix card in its prompt; fine-tuning it %s (card=%s)", path,
                    "with" if policy.config.card else "without", "with" if card else "without", card)
        policy.config = dataclasses.replace(policy.config, card=card)
    return policy
