"""Experiment trackers: Weights & Biases and MLflow runs beside the run folder's own logs.

``trainer.loggers`` names the run logs besides ``metrics.jsonl`` and ``metrics.png`` (always
written): ``tensorboard`` (written by rank 0's worker, ``metrics.RunLogger``) and the trackers
``wandb`` and ``mlflow``. Only the driver talks to a tracker; the workers never import one.
Rank 0's worker writes the metrics and evaluation reports into the run folder, and the
driver's :class:`~embodied_rl.trackers.feed.TrackerFeed` forwards what is new there at every
status poll (``launch/drive.py``): scalars per step, the resolved config, the evaluation
success tables and videos, and the run folder's path. A tracker that fails during the run is
reported once and dropped; training goes on.

The trackers sit above the runtime: they read its config sections and run folder, and the
runtime never imports them. So the names the validator checks (``LOGGERS``, ``TRACKERS``,
``check_loggers``) live with ``trainer.loggers`` in ``runtime/config_sections.py``; the
trackers themselves are in ``feed.py``, ``wandb_run.py`` and ``mlflow_run.py``, imported by
the driver (``embodied_rl/launch/``).
"""
