"""OpenVLA action tokens: continuous actions in [-1, 1] <-> the last 256 vocabulary ids.

Discretisation (the convention the released OpenVLA / OpenVLA-OFT checkpoints were trained
with, ``prismatic.vla.action_tokenizer``):

- ``edges = linspace(-1, 1, 256)`` (256 edges, so 255 bins plus the value 1.0 itself) and
  ``centers = (edges[:-1] + edges[1:]) / 2`` (255 centres).
- Encode: clip to [-1, 1], ``d = digitize(x, edges)`` in [1, 256], ``token = V - d`` where
  ``V`` is the tokenizer vocabulary (32000 for Llama-2). Token ids are therefore the last 256
  ids ``[V - 256, V)``, with *larger* actions on *smaller* ids.
- Decode: ``centers[clip(V - token - 1, 0, 254)]`` (ids ``V - 256`` and ``V - 255`` both decode
  to the top centre).

The 256 action ids sit at positions ``[V - 256, V)`` of the (padded) LM output, so the action
logits are ``logits[..., V - 256 - P : V - P]`` for a padded size ``P`` (``-320:-64`` for
32000/32064). "Index" below means the position in that 256-wide slice:
``index = token - (V - 256)``, i.e. the slice position the policy samples.

De-normalisation of the decoded actions and the gripper convention live in
``policies/normalization.py``.
"""

from __future__ import annotations

import torch

N_ACTION_BINS = 256


class ActionTokenizer:
    """Maps continuous actions in [-1, 1] to the last ``n_bins`` ids of a vocabulary and back.

    Args:
        vocab_size: ``V``, one past the last action token id (the tokenizer's vocabulary
            without the LM's padding rows; 32000 for OpenVLA).
        padded_vocab_size: rows of the LM output layer (32064 for OpenVLA); ``vocab_size``
            when the LM is not padded.
        n_bins: number of action ids (256).
    """

    def __init__(
        self, vocab_size: int, padded_vocab_size: int | None = None, n_bins: int = N_ACTION_BINS
    ) -> None:
        padded = vocab_size if padded_vocab_size is None else padded_vocab_size
        if n_bins < 2 or vocab_size < n_bins or padded < vocab_size:
            raise ValueError(
                f"need 2 <= n_bins ({n_bins}) <= vocab_size ({vocab_size}) <= "
                f"padded_vocab_size ({padded})"
            )
        self.vocab_size = vocab_size
        self.padded_vocab_size = padded
        self.n_bins = n_bins
        # Explicit CPU device: policies are built under ``torch.device("meta")`` when loading.
        self.edges = torch.linspace(-1.0, 1.0, n_bins, dtype=torch.float64, device="cpu")
        self.centers = (self.edges[:-1] + self.edges[1:]) / 2

    @property
    def first_id(self) -> int:
        """The smallest action token id, ``V - n_bins``."""
        return self.vocab_size - self.n_bins

    @property
    def logit_slice(self) -> slice:
        """Slice of the (padded) LM logits' last dim holding the action ids, from the end."""
        stop = self.vocab_size - self.padded_vocab_size
        return slice(self.first_id - self.padded_vocab_size, stop if stop < 0 else None)

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Token ids (int64, same shape) of normalised actions (any shape, clipped to [-1, 1])."""
        clipped = actions.to(torch.float64).clamp(-1.0, 1.0)
        # bucketize(right=True) is numpy's digitize: edges[d-1] <= x < edges[d].
        digitized = torch.bucketize(clipped, self.edges.to(clipped.device), right=True)
        return self.vocab_size - digitized

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Bin centres (float32, same shape) of action token ids."""
        index = (self.vocab_size - tokens.long() - 1).clamp(0, self.centers.numel() - 1)
        return self.centers.to(tokens.device)[index].float()

    def index_to_token(self, index: torch.Tensor) -> torch.Tensor:
        """Token ids of positions in the 256-wide action-logit slice."""
        return index.long() + self.first_id

    def token_to_index(self, tokens: torch.Tensor) -> torch.Tensor:
        """Positions in the action-logit slice of token ids; raises on non-action ids."""
        index = tokens.long() - self.first_id
        if bool(((index < 0) | (index >= self.n_bins)).any()):
            bad = tokens[(index < 0) | (index >= self.n_bins)].unique()[:8].tolist()
            raise ValueError(
                f"token ids {bad} are not action tokens (valid ids: {self.first_id}.."
                f"{self.vocab_size - 1}); were they sampled by a policy with another vocabulary?"
            )
        return index
