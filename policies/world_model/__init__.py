"""Video world models to pretrain, registered as ``world_model.vjepa2`` (``vjepa.py``)."""

from policies.world_model.vjepa import VJepa2WorldModel, VJepa2WorldModelOptions

__all__ = ["VJepa2WorldModel", "VJepa2WorldModelOptions"]
