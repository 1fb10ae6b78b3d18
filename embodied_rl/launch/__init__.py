"""The driver: start Ray, one DAG worker per device bundle, watch them, report.

The driver never receives batch data: it sends each worker the resolved config, and gets back
only small status and metric records (the newest are kept in ``RunResult.records``, so a test
can check that).

This package sits above ``runtime`` (the workers and the config) and ``trackers`` (the W&B and
MLflow runs the driver feeds) and imports both; neither imports it, so no worker can reach it.
One module per concept:

- ``launcher.py``: :func:`~embodied_rl.launch.launcher.launch`, the entry of ``embodied-rl
  train`` and ``eval``: the run folder, the saved config, the trackers, the outcome;
- ``ray_setup.py``: start or join Ray, place one bundle per worker, preview the placement;
- ``drive.py``: start the worker actors, drive them through rendezvous, setup and run, take
  everything down again;
- ``monitor.py``: wait on the workers' calls, poll their status, explain a failure;
- ``outcome.py``: what a run ends with, :class:`~embodied_rl.launch.outcome.RunResult` or a
  :class:`~embodied_rl.launch.outcome.RunFailed` the CLI reports.
"""
