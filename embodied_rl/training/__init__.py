"""The update engine shared by every training node (``actor.train``, ``critic.train``,
``sft.train``).

- :mod:`~embodied_rl.training.inputs`: what a policy's ``evaluate`` reads, by input kind
  (``text`` for LLM responses, ``trajectory`` for embodied episodes).
- :mod:`~embodied_rl.training.updates`: the epoch x mini-batch loop, one optimizer update
  over micro-batches, and the global counts a loss is normalised by.
- :mod:`~embodied_rl.training.gradients`: gradient sync over the data-parallel group and
  clipping (DDP flat all-reduce, FSDP shards).
- :mod:`~embodied_rl.training.guard`: the non-finite guard: skip an update everywhere when any
  rank's loss or the global gradient norm is not finite, and stop after too many in a row.

Nodes import these modules; nothing imports a node module for a helper.
"""
