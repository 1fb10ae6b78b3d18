"""What every policy with ordered action bins (``BinnedActionPolicy``) must satisfy."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.interfaces import BinnedActionPolicy


def check_bin_logprobs(policy: BinnedActionPolicy, batch: TensorDict, bins: int) -> None:
    """``bin_logprobs`` is ``evaluate`` at temperature 1 before the gather: each valid row is
    a distribution over ``bins`` whose entry at the stored bin is evaluate's log-prob, the
    positions are the stored outputs', and masked steps are all 0."""
    assert isinstance(policy, BinnedActionPolicy)
    b, t = batch[K.STEP_MASK].shape
    logprobs, index = policy.bin_logprobs(batch)
    expected, _ = policy.evaluate(batch, 1.0)
    assert logprobs.shape == (*expected.shape, bins) and index.shape == expected.shape
    assert index.dtype == torch.int64 and int(index.min()) >= 0 and int(index.max()) < bins
    valid = batch[K.STEP_MASK].bool().repeat_interleave(expected.shape[1] // t, dim=1)
    assert torch.allclose(logprobs.exp().sum(-1)[valid], torch.ones(int(valid.sum())), atol=1e-5)
    assert bool((logprobs[~valid] == 0).all()) and bool((index[~valid] == 0).all())
    chosen = logprobs.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(chosen, expected, atol=1e-5)
