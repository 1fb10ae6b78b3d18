"""A LIBERO world model for SRPO, end to end: data, V-JEPA pretraining, then the latent comparison.

Phases (each the CLI as a user runs it; a phase whose output exists is reused, so the script
resumes where it stopped; ``--fresh`` reruns everything):

1. ``demos``: scripted demos of every task of the suite from the training init states
   (``--train-inits``) and the validation ones (``--validation-inits``), 64 px.
2. ``sft``: one-demo-per-task behaviour cloning of ``policy=mlp_image`` (init state 0's demo),
   the policy whose rollouts give successes and near-miss failures.
3. ``record_random`` / ``record_sft``: rollouts of the random-init and the SFT policy on the
   training init states (``record_libero``), labelled episode videos;
   ``record_sft_validation``: the SFT policy on the validation init states (the comparison's
   failures; never used for pretraining).
4. ``pretrain``: ``pretrain_vjepa_libero`` on the demos and the training-state recordings
   (videos from held-out init states are left out by ``data.heldout_every``), then
   ``embodied-rl export`` of it.
5. ``latents``: ``world_model_latents.py`` on the validation videos (demos + SFT rollouts):
   the pooled-pixel embedding, the same V-JEPA architecture at random init, and the pretrained
   one.

The JSON (``docs/benchmarks/world_model_pretraining.json`` by default) records every command,
each phase's wall time and the pretraining curve; the comparison writes its own JSON + PNG.

Run (about 1.5 hours on 2 idle cores)::

    .venv/bin/python scripts/bench/world_model_pretraining.py

On another machine, the SRPO comparison (``srpo_world_model.py``) needs the same SFT start and
world model as its recorded runs: rebuild only the phases it reads, checked against the
recorded JSON (the SFT start's weight digest and the pretraining curve, update by update,
must come out equal; the run stops at the first difference)::

    .venv/bin/python scripts/bench/world_model_pretraining.py --runs <folder> \
        --phases demos sft record_random record_sft pretrain export \
        --recorded docs/benchmarks/world_model_pretraining_run2.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import common
from libero_learning import cli, read_jsonl, run

NAME = "world_model_pretraining"
ENCODER_FRAMES = {"num_frames": 16, "resize_short": 64, "crop_size": 64}
PHASES = (
    "demos", "sft", "record_random", "record_sft", "record_sft_validation", "pretrain",
    "export", "latents",
)  # fmt: skip
# the phases whose output each phase reads
NEEDS = {
    "sft": ("demos",),
    "record_sft": ("sft",),
    "record_sft_validation": ("sft",),
    "pretrain": ("demos", "record_random", "record_sft"),
    "export": ("pretrain",),
    "latents": ("demos", "record_sft_validation", "export"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="libero_object")
    parser.add_argument("--train-inits", type=int, nargs="+", default=[0, 1, 2, 3, 5, 6, 7, 8])
    parser.add_argument("--validation-inits", type=int, nargs="+", default=[4, 14, 24, 34, 44])
    parser.add_argument("--demos", type=Path, nargs="+", default=None, help="existing demo folders")
    parser.add_argument("--max-steps", type=int, default=160, help="env steps per episode")
    parser.add_argument("--sft-steps", type=int, default=2000)
    parser.add_argument("--temperature", type=float, default=0.3, help="SFT rollouts (SRPO's)")
    parser.add_argument("--record-steps", type=int, default=4, help="batches per recording")
    parser.add_argument("--pretrain-steps", type=int, default=1000)
    parser.add_argument("--runs", type=Path, default=Path("outputs") / NAME)
    parser.add_argument("--out", type=Path, default=None, help="JSON/plot folder")
    parser.add_argument("--fresh", action="store_true", help="rerun phases with results")
    parser.add_argument(
        "--phases", nargs="+", default=list(PHASES), choices=PHASES,
        help="run only these (the SRPO comparison needs demos sft record_random record_sft "
        "pretrain export); a phase left out is reused where its output is here",
    )  # fmt: skip
    parser.add_argument(
        "--recorded", type=Path, default=None,
        help="an earlier JSON of this benchmark: the SFT start's weights and the pretraining "
        "curve must come out equal to its (a rebuild on another machine), else the run stops",
    )  # fmt: skip
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- commands
def simulator_overrides(args: argparse.Namespace) -> list[str]:
    return [
        "policy=mlp_image",
        f"simulator.options.suite={args.suite}",
        f"simulator.options.max_steps={args.max_steps}",
        "+simulator.options.max_cached_tasks=2",
    ]


def demos_command(args: argparse.Namespace, out: Path) -> list[str]:
    inits = [str(i) for i in args.train_inits + args.validation_inits]
    return cli(
        "demos", "--suite", args.suite, "--tasks", "all", "--init-states", *inits,
        "--image-size", "64", "--no-progress", "--overwrite", "--processes", "2",
        "--out", str(out),
    )  # fmt: skip


def sft_command(args: argparse.Namespace, demos: list[Path], run_dir: Path) -> list[str]:
    return cli(
        "train", "--config-name", "sft_libero", "--no-progress",
        *simulator_overrides(args),
        f"data.paths=[{','.join(str(d) for d in demos)}]",
        "data.max_demos_per_task=1",  # the first demo of each task: init state 0
        "data.batch_size=64",
        "models.actor.optimizer.lr=1e-3",
        "eval.at_end=false",
        f"trainer.total_steps={args.sft_steps}",
        f"trainer.checkpoint_every={args.sft_steps}",
        f"run_dir={run_dir}",
    )  # fmt: skip


def record_command(
    args: argparse.Namespace, run_dir: Path, split: str, sft: Path | None, temperature: float
) -> list[str]:
    """Train split: ``--record-steps`` batches of 8 pairs; validation: each of its pairs once
    (10 per batch, as many batches as it takes)."""
    start = [f"models.actor.init_from={sft}"] if sft is not None else []
    pairs = 10 if split == "validation" else 8
    steps = (
        -(-10 * len(args.validation_inits) // pairs) if split == "validation" else args.record_steps
    )
    return cli(
        "train", "--config-name", "record_libero", "--no-progress",
        *simulator_overrides(args), *start,
        f"data.split={split}",
        f"data.batch_size={pairs}",  # (task, init state) pairs per batch
        "rollout.group_size=4",
        "rollout.num_envs=4",
        f"rollout.temperature={temperature}",
        f"trainer.total_steps={steps}",
        f"run_dir={run_dir}",
    )  # fmt: skip


def pretrain_command(args: argparse.Namespace, videos: list[Path], run_dir: Path) -> list[str]:
    return cli(
        "train", "--config-name", "pretrain_vjepa_libero", "--no-progress",
        f"data.paths=[{','.join(str(v) for v in videos)}]",
        f"trainer.total_steps={args.pretrain_steps}",
        f"trainer.checkpoint_every={max(1, args.pretrain_steps // 4)}",
        f"run_dir={run_dir}",
    )  # fmt: skip


def latents_command(
    args: argparse.Namespace, videos: list[Path], model: Path, out: Path
) -> list[str]:
    config = pretrain_model_config()
    random = {"config": config, "seed": 0, **ENCODER_FRAMES}
    pretrained = {"path": str(model), **ENCODER_FRAMES}
    return [
        sys.executable, str(Path(__file__).with_name("world_model_latents.py")),
        "--videos", *[str(v) for v in videos],
        "--encoder", "pooled_pixels=video_encoder.cheap",
        "--encoder", f"vjepa_random_init=video_encoder.vjepa2:{json.dumps(random)}",
        "--encoder", f"vjepa_pretrained=video_encoder.vjepa2:{json.dumps(pretrained)}",
        "--split", "validation", "--heldout-every", "5", "--device", "cpu",
        "--out", str(out),
    ]  # fmt: skip


def pretrain_model_config() -> dict[str, Any]:
    """The ``VJEPA2Config`` of ``pretrain_vjepa_libero`` (the random-init row uses the same)."""
    from omegaconf import OmegaConf

    path = Path(__file__).resolve().parents[2] / "configs" / "pretrain_vjepa_libero.yaml"
    return dict(OmegaConf.to_container(OmegaConf.load(path).models.world_model.options.config))


def weights_sha256(run_dir: Path) -> str | None:
    """sha256 of the actor weights of ``run_dir``'s newest checkpoint (each entry's name and
    bytes, in name order): the same policy gives the same digest whatever the optimiser
    state, RNG state or file layout around it; ``None`` without a checkpoint."""
    import torch

    from embodied_rl.checkpoint import latest_checkpoint, load_entry

    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    if checkpoint is None:
        return None
    state = load_entry(checkpoint, "models")["model/actor"]
    digest = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()


# ------------------------------------------------------------------------------- phases
class Phases:
    """Runs each phase once; its command and wall seconds go into ``records``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.records = args, {}
        self.done_file = args.runs / "phases.json"
        self.done = (
            {}
            if args.fresh or not self.done_file.exists()
            else json.loads(self.done_file.read_text())
        )

    def run(self, name: str, command: list[str], output: Path) -> None:
        if name in self.done and output.exists():
            self.records[name] = self.done[name]
            return
        if name not in self.args.phases:  # left out, and nothing chosen reads it (checked)
            return
        resumed = resumable(command, output)
        if resumed:
            # A training run cut short (e.g. its session ended) goes on from its newest
            # checkpoint; the seconds recorded are then this attempt's only ("resumed").
            command = [*command, "resume=true"]
        elif output.exists() and output.is_dir() and name != "demos":
            shutil.rmtree(output)  # a phase that did not finish starts again
        seconds = run(command, self.args.runs / "logs" / f"{name}.log")
        self.records[name] = {"command": " ".join(command[1:]), "seconds": seconds}
        if resumed:
            self.records[name]["resumed"] = True
        self.done[name] = self.records[name]
        self.done_file.write_text(json.dumps(self.done, indent=1))


def resumable(command: list[str], output: Path) -> bool:
    """Whether ``command`` is an ``embodied-rl train`` run whose folder ``output`` holds a
    checkpoint from an earlier, unfinished attempt (``resume=true`` goes on from it)."""
    return "train" in command[:4] and any((output / "checkpoints").glob("step_*"))


def recordings(run_dir: Path) -> Path:
    return run_dir / "episodes"


def phase_outputs(args: argparse.Namespace, out_dir: Path) -> dict[str, Path]:
    """Where each phase writes (``--demos``: the first given folder stands for ``demos``)."""
    outputs = {name: args.runs / name for name in PHASES}
    if args.demos:
        outputs["demos"] = args.demos[0].resolve()
    outputs["export"] = args.runs / "vjepa_libero"
    outputs["latents"] = out_dir / "world_model_latents.json"
    return outputs


def missing_inputs(args: argparse.Namespace, phases: Phases, outputs: dict[str, Path]) -> list[str]:
    """``"<phase> needs <input>"`` for each chosen phase whose input is neither chosen nor
    here (given ``--demos`` count as here)."""
    finished = {n for n in phases.done if outputs[n].exists()}  # Phases: none with --fresh
    available = set(args.phases) | finished
    if args.demos:
        available.add("demos")
    return [
        f"{name} needs {need} ({outputs[need]})"
        for name in args.phases
        for need in NEEDS.get(name, ())
        if need not in available
    ]


def first_difference(ours: list[dict[str, float]], theirs: list[dict[str, float]]) -> str | None:
    """Where two pretraining curves first differ (loss or target spread, exactly, update by
    update), or ``None`` when they are equal: the same world model came out."""
    for update, (mine, recorded) in enumerate(zip(ours, theirs, strict=False)):
        for key in ("world_model/loss", "world_model/target_std"):
            if mine.get(key) != recorded.get(key):
                return f"update {update}: {key} {mine.get(key)} vs {recorded.get(key)} recorded"
    if len(ours) != len(theirs):
        return f"{len(ours)} updates vs {len(theirs)} recorded"
    return None


def refuse_difference(what: str, difference: str | None) -> None:
    """Stop the rebuild (``--recorded``) when ``what`` came out other than recorded."""
    if difference is not None:
        raise SystemExit(
            f"error: --recorded: the rebuilt {what} differs from the recorded one "
            f"({difference}). Runs made with the recorded one do not compare with runs on this "
            "one; rerun without --recorded to keep this one (its phases are reused)"
        )


def pretrain_curve(run_dir: Path) -> list[dict[str, float]]:
    """Loss and target spread of every pretraining update (none before the phase ran)."""
    metrics = run_dir / "metrics.jsonl"
    keys = ("step", "world_model/loss", "world_model/target_std")
    if not metrics.exists():
        return []
    return [{k: m[k] for k in keys if k in m} for m in read_jsonl(metrics)]


def plot(curve: list[dict[str, float]], out: Path | None) -> Path:
    """The pretraining loss and the spread of the target latents (collapse would be ~0)."""
    fig, axes = common.new_figure(ncols=2, width=10.0, height=3.6)
    steps = [p["step"] + 1 for p in curve]
    for ax, key, title in (
        (axes[0], "world_model/loss", "V-JEPA loss (L1 in latent space)"),
        (axes[1], "world_model/target_std", "target latent std (collapse: ~0)"),
    ):
        ax.plot(steps, [p.get(key, float("nan")) for p in curve], linewidth=1.0)
        ax.set_xlabel("update")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
    return common.save_figure(fig, NAME, out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.runs = args.runs.resolve()
    args.runs.mkdir(parents=True, exist_ok=True)
    phases = Phases(args)
    out_dir = args.out or Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
    outputs = phase_outputs(args, out_dir)
    missing = missing_inputs(args, phases, outputs)
    if missing:  # refused before any phase runs
        raise SystemExit(
            f"error: --phases: {'; '.join(missing)}. Fix: add those phases to --phases "
            "(or point --runs at a folder where they ran)"
        )
    if args.recorded is not None and not args.recorded.is_file():
        raise SystemExit(
            f"error: --recorded {args.recorded}: no such file. Fix: give an earlier JSON of this "
            f"benchmark (e.g. docs/benchmarks/{NAME}_run2.json) or leave it out"
        )
    recorded = json.loads(args.recorded.read_text()) if args.recorded else None
    if recorded is not None and recorded.get("benchmark") != NAME:
        raise SystemExit(
            f"error: --recorded {args.recorded}: not a {NAME} result "
            f"(benchmark={recorded.get('benchmark')!r}). Fix: give this benchmark's JSON "
            f"(e.g. docs/benchmarks/{NAME}_run2.json)"
        )
    demos = [d.resolve() for d in args.demos] if args.demos else [outputs["demos"]]
    if not args.demos:
        phases.run("demos", demos_command(args, demos[0]), demos[0])
    sft = outputs["sft"]
    phases.run("sft", sft_command(args, demos, sft), sft)
    sft_digest = weights_sha256(sft)
    if recorded and recorded.get("sft_weights_sha256") and sft_digest is not None:
        theirs = recorded["sft_weights_sha256"]
        same = sft_digest == theirs
        refuse_difference(
            "SFT start", None if same else f"sha256 {sft_digest[:12]} vs {theirs[:12]}"
        )
    runs = {
        "record_random": (outputs["record_random"], "train", None, 1.0),
        "record_sft": (outputs["record_sft"], "train", sft, args.temperature),
        "record_sft_validation": (
            outputs["record_sft_validation"],
            "validation",
            sft,
            args.temperature,
        ),
    }
    for name, (run_dir, split, start, temperature) in runs.items():
        phases.run(name, record_command(args, run_dir, split, start, temperature), run_dir)
    pretrain = outputs["pretrain"]
    videos = demos + [recordings(runs[n][0]) for n in ("record_random", "record_sft")]
    phases.run("pretrain", pretrain_command(args, videos, pretrain), pretrain)
    curve = pretrain_curve(pretrain)
    if recorded and recorded.get("pretrain_curve") and curve:
        refuse_difference("world model", first_difference(curve, recorded["pretrain_curve"]))
    model = outputs["export"]
    export = cli("export", str(pretrain), "--out", str(model), "--force")
    phases.run("export", export, model)
    latents_json = outputs["latents"]
    validation = demos + [recordings(runs["record_sft_validation"][0])]
    phases.run("latents", latents_command(args, validation, model, latents_json), latents_json)
    rows = [
        {"phase": name, "minutes": rec["seconds"] / 60.0} for name, rec in phases.records.items()
    ]
    common.print_table(rows, ["phase", "minutes"])
    payload = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "phases": phases.records,
        "sft_weights_sha256": sft_digest,
        "pretrain_curve": curve,
    }
    common.write_results(NAME, payload, args.out)
    plot(curve, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
