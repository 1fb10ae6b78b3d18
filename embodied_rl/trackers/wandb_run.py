"""The Weights & Biases tracker (``wandb`` in ``trainer.loggers``; ``trainer.wandb``).

Offline by default: the run is written under ``<dir>/wandb/offline-run-<time>-<id>/`` (the
run directory unless ``trainer.wandb.dir``) with no network and no account, and uploaded
later with ``wandb sync <that folder>``. W&B's service process (``wandb-core``) is stopped
when the run ends, so nothing outlives the driver. Console capture, system metrics, git and
code saving are off: the driver's console stays as it is, and a run costs no extra threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from embodied_rl.runtime.config_compose import one_line
from embodied_rl.runtime.config_sections import WandbConfig
from embodied_rl.trackers.base import (
    FINISHED,
    TABLE_COLUMNS,
    EvalReport,
    RunInfo,
    Tracker,
    TrackerError,
    check_writable,
)


class WandbTracker(Tracker):
    """One W&B run per training run (a resumed run continues it: same id)."""

    name = "wandb"

    def __init__(self, settings: WandbConfig, info: RunInfo) -> None:
        import wandb

        self._wandb = wandb
        folder = Path(settings.dir).expanduser().resolve() if settings.dir else info.run_dir
        check_writable(folder, "trainer.wandb.dir")
        run_id = info.previous.get(self.name, {}).get("id")
        try:
            self.run = wandb.init(
                project=settings.project,
                entity=settings.entity,
                dir=str(folder),
                name=info.title,
                group=info.name,
                job_type=info.mode,
                config=dict(info.config),
                notes=f"embodied_rl run folder: {info.run_dir}",
                id=run_id,
                resume="allow" if run_id else None,
                settings=_settings(wandb, settings.mode),
            )
        except Exception as err:  # noqa: BLE001 - wandb raises its own types and OSError
            wandb.teardown()
            raise TrackerError(
                f"trainer.loggers: W&B could not start a {settings.mode} run in {folder} "
                f"({type(err).__name__}: {one_line(err)})",
                "check trainer.wandb (online mode needs `wandb login` and network; offline "
                "needs a writable trainer.wandb.dir), or remove wandb from trainer.loggers",
            ) from None
        self.folder = Path(self.run.dir).parent  # <dir>/wandb/offline-run-.../

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def log_eval(self, report: EvalReport) -> None:
        wandb = self._wandb
        table = wandb.Table(columns=list(TABLE_COLUMNS), data=report.table_rows())
        # Under <name>/report/: rollout.videos logs the scalar <name>/videos already.
        media: dict[str, Any] = {f"{report.name}/report/success_table": table}
        videos = [wandb.Video(str(path), format="mp4", caption=path.stem) for path in report.videos]
        if videos:
            media[f"{report.name}/report/videos"] = videos
        self.run.log(media, step=report.row)

    def finish(self, status: str) -> None:
        try:
            self.run.finish(exit_code=0 if status == FINISHED else 1)
        finally:
            self._wandb.teardown()  # stops wandb-core: the driver exits promptly

    def record(self) -> dict[str, Any]:
        return {"id": self.run.id, "project": self.run.project, "folder": str(self.folder)}


def _settings(wandb: Any, mode: str) -> Any:
    """W&B settings of a tracker that only records what the driver logs."""
    return wandb.Settings(
        mode=mode,
        console="off",  # no capture of the driver's stdout/stderr
        silent=True,
        x_disable_stats=True,  # no system-metrics sampler
        x_disable_machine_info=True,
        disable_git=True,
        save_code=False,
        x_save_requirements=False,
        disable_job_creation=True,
    )
