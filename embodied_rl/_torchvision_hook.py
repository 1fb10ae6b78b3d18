"""Apply the torchvision fix lazily in every process of a venv (loaded by a ``.pth`` file).

vLLM starts processes of its own (the engine core, model inspection) that never import
``embodied_rl``, so :func:`embodied_rl._compat.ensure_torchvision_ops` would not run in them
before transformers imports the registry's CUDA-only torchvision. ``scripts/install_vllm.sh``
puts a ``.pth`` file into the vLLM venv that runs this file at interpreter start-up. It only
registers an import hook: nothing (not even torch) is imported until something imports
torchvision, so ``pip`` and other tools start as fast as before.

This file must not import anything from ``embodied_rl`` at module level.
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder


class _FixBeforeTorchvision(MetaPathFinder):
    """Runs the fix right before the first ``import torchvision``, then steps aside."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 (importlib protocol)
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        from embodied_rl._compat import ensure_torchvision_ops

        ensure_torchvision_ops()
        return None  # the regular finders import torchvision itself


if not any(type(f).__name__ == _FixBeforeTorchvision.__name__ for f in sys.meta_path):
    sys.meta_path.insert(0, _FixBeforeTorchvision())
