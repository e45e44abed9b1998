"""Why a model cannot be used: the user's model, not the machine (facts.errors.UserError, exit 2, never retried)."""

from __future__ import annotations

from facts.errors import UserError


class ModelSourceError(UserError, ValueError):
    """The model location cannot be resolved to a folder with a Hugging Face config."""


class UnsupportedArchitecture(ModelSourceError):
    """The model's class does not expose what sharding needs (decoder layers, embeddings, lm_head)."""
