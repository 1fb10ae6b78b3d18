"""Does a video encoder's latent space mean task progress? Encoders compared on labelled videos.

SRPO scores a failed trajectory by how close its video embedding lies to the successful
trajectories of the same task (docs/ALGORITHMS.md, "SRPO"). That reward is only as good as the
encoder's latent space; this script measures two things on held-out labelled episode videos
(``embodied_rl/data/episode_videos.py``: LIBERO demo files and our episode video files) for
each ``--encoder`` (any ``video_encoder.*`` of ``policies/encoders/``):

1. *Separation* (AUC). Per task (instruction): embed all its episodes; z-score every dimension
   with that task's mean and standard deviation (population std, floored at 1e-6); an
   episode's score is minus the L2 distance to the centroid of the task's OTHER successes
   (leave-one-out: a success is never compared with itself). The AUC of that score for
   success vs failure is the Mann-Whitney U statistic over (success, failure) pairs, ties
   counting 1/2; per task, and pooled over every scored episode of every task. Tasks with
   fewer than 2 successes or no failure are skipped and counted.
2. *Progress* (Spearman). Every success of ``T >= 8`` frames in a task with another success
   (demos count) is embedded at prefixes ``f = 0.1, 0.2, ..., 1.0`` of its length
   (``max(1, round(f * T))`` frames); each prefix's distance (the task's z-scoring) to the
   centroid of the task's other successes; per episode, the Spearman rank correlation of ``f``
   with minus that distance (average ranks for ties). The plot's curve is the mean over
   episodes of each episode's distances divided by its own maximum (so every curve lies in
   (0, 1] and no episode weighs more for being far away).
3. *Failure ranking* (Spearman with privileged progress), where SRPO uses the reward: per
   task, SRPO's failure reward of its failed episodes (reference shaping, the task's
   successes as references) against their privileged progress (recorded in episode files by
   ``rollout.save_episodes``); pooled over the failures of every task with a success and 3
   or more failures, with a 95% bootstrap interval (failures resampled within their task).

An encoder samples its frames inside each episode's valid length, so a prefix is embedded by
passing a smaller length. ``--max-frames`` caps the frames read per video (``floor(linspace)``
indices, as the encoders sample); a prefix of ``L`` original frames then keeps the read
frames with index ``< L``.

Output: a table on stdout, the JSON (``--out``, everything incl. per-task numbers and the
command) and a PNG beside it (AUC per encoder; mean normalised distance vs progress).

Run::

    .venv/bin/python scripts/bench/world_model_latents.py --videos data/episodes \\
        --encoder pooled=video_encoder.cheap \\
        --encoder 'vjepa_random=video_encoder.vjepa2:{"config": {"hidden_size": 384,
            "num_hidden_layers": 4, "num_attention_heads": 6, "crop_size": 64,
            "frames_per_clip": 16}, "num_frames": 16,
            "resize_short": 64, "crop_size": 64}' \\
        --encoder 'vjepa_pretrained=video_encoder.vjepa2:{"path": "models/vjepa_libero",
            "num_frames": 16, "resize_short": 64, "crop_size": 64}' \\
        --split validation --out docs/benchmarks/world_model_latents.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import common
import numpy as np
from latent_metrics import progress_distances, progress_summary, rank_failures, separation

NAME = "world_model_latents"
FRACTIONS = tuple(round(0.1 * k, 1) for k in range(1, 11))  # 0.1, 0.2, ..., 1.0
MIN_PROGRESS_LENGTH = 8
SPEC_HELP = (
    "LABEL=REGISTRY_NAME[:JSON_OPTIONS], e.g. pooled=video_encoder.cheap or "
    'vjepa=video_encoder.vjepa2:{"path": "models/vjepa_libero"}'
)


# ----------------------------------------------------------------------------- inputs


class EncoderSpecError(ValueError):
    """A bad ``--encoder`` spec, name or options; the message names the fix."""


@dataclass
class EncoderSpec:
    """One ``--encoder LABEL=REGISTRY_NAME[:JSON_OPTIONS]``."""

    label: str
    name: str
    options: dict[str, Any] = field(default_factory=dict)


def parse_encoder_spec(text: str) -> EncoderSpec:
    """Parse ``LABEL=REGISTRY_NAME[:JSON_OPTIONS]``; the registry name is checked later
    (:func:`build_encoder`).

    Raises:
        EncoderSpecError: the spec's shape or its JSON is wrong, naming the fix.
    """
    label, sep, rest = text.partition("=")
    name, colon, raw = rest.partition(":")
    label, name = label.strip(), name.strip()
    if not sep or not label or not name:
        raise EncoderSpecError(f"--encoder {text!r}: expected {SPEC_HELP}")
    options: Any = {}
    if colon:
        try:
            options = json.loads(raw)
        except json.JSONDecodeError as err:
            raise EncoderSpecError(
                f"--encoder {label}: options {raw!r} are not valid JSON ({err}); quote the "
                f"whole spec in single quotes in the shell, e.g. {SPEC_HELP}"
            ) from None
        if not isinstance(options, dict):
            raise EncoderSpecError(
                f"--encoder {label}: options must be a JSON object ({{...}}), got {raw!r}"
            )
    return EncoderSpec(label, name, options)


def build_encoder(spec: EncoderSpec, device: str) -> Any:
    """The encoder of ``spec``, built through the registry (``model_builder``).

    Raises:
        EncoderSpecError: an unknown encoder name (listing the known ones) or bad options.
    """
    from embodied_rl.registry import VIDEO_ENCODERS, load_plugins, model_builder

    load_plugins(("policies",))
    if spec.name not in VIDEO_ENCODERS:
        raise EncoderSpecError(
            f"--encoder {spec.label}: {spec.name!r} is not a video encoder; use one of "
            f"{VIDEO_ENCODERS.names()} ({SPEC_HELP})"
        )
    path = spec.options.get("path")
    if isinstance(path, str) and not Path(path).exists():
        raise EncoderSpecError(
            f"--encoder {spec.label}: path {path!r} does not exist; point it at a local "
            "checkpoint folder (config.json and safetensors)"
        )
    try:
        return model_builder(spec.name)(spec.options, device).eval()
    except (TypeError, ValueError, OSError) as err:
        raise EncoderSpecError(f"--encoder {spec.label} ({spec.name}): {err}") from err


def select_videos(infos: list[Any], split: str, heldout_every: int) -> tuple[list[Any], int]:
    """The videos of ``split`` (by init state, ``embodied_rl.data.tasks.split_of``) and how
    many were left out for recording no init state (kept only under ``all``)."""
    from embodied_rl.data.tasks import split_of

    if split == "all":
        return list(infos), 0
    known = [i for i in infos if i.init_state is not None]
    kept = [i for i in known if split_of(i.init_state, heldout_every) == split]
    return kept, len(infos) - len(known)


def read_indices(length: int, max_frames: int) -> np.ndarray:
    """Which frames of a ``length``-frame video to read: all, or ``max_frames`` spread with
    ``floor(linspace)`` as the encoders sample (ascending)."""
    from embodied_rl.data.episode_videos import sample_frame_indices

    if length <= max_frames:
        return np.arange(length)
    return sample_frame_indices(length, max_frames).numpy()


def prefix_length(read: np.ndarray, length: int, fraction: float) -> int:
    """How many read frames lie in the first ``max(1, round(fraction * length))`` original
    frames (at least 1); ``read`` holds the ascending original indices of the read frames."""
    keep = max(1, round(fraction * length))
    return max(1, int(np.searchsorted(read, keep)))


# ----------------------------------------------------------------------------- embedding


class Batcher:
    """Collects (key, clip, valid length) and embeds them ``batch_size`` at a time, one batch
    per image shape (demo files and rollouts may differ); results land in ``out[key]``."""

    def __init__(self, encoder: Any, batch_size: int) -> None:
        self.encoder, self.batch_size = encoder, batch_size
        self.pending: dict[tuple[int, ...], list[tuple[Any, np.ndarray, int]]] = defaultdict(list)
        self.out: dict[Any, np.ndarray] = {}

    def add(self, key: Any, clip: np.ndarray, length: int) -> None:
        """Queue ``clip`` (T, H, W, 3) uint8 with its first ``length`` frames valid."""
        shape = tuple(clip.shape[1:])
        self.pending[shape].append((key, clip, length))
        if len(self.pending[shape]) >= self.batch_size:
            self._flush(shape)

    def finish(self) -> dict[Any, np.ndarray]:
        """Embed whatever is queued; returns ``{key: (D,) float32}``."""
        for shape in list(self.pending):
            self._flush(shape)
        return self.out

    def _flush(self, shape: tuple[int, ...]) -> None:
        import torch

        items = self.pending.pop(shape, [])
        if not items:
            return
        # only the valid frames are copied: a prefix's padding is never looked at
        frames = np.zeros((len(items), max(n for _, _, n in items), *shape), np.uint8)
        for row, (_, clip, n) in enumerate(items):
            frames[row, :n] = clip[:n]
        lengths = torch.tensor([n for _, _, n in items], dtype=torch.int64)
        embedded = self.encoder.encode(torch.from_numpy(frames), lengths).numpy()
        for (key, _, _), vector in zip(items, embedded):
            self.out[key] = vector


def group_by_task(infos: Sequence[Any]) -> dict[str, list[int]]:
    """Video indices per instruction (the task key), in video order."""
    tasks: dict[str, list[int]] = defaultdict(list)
    for i, info in enumerate(infos):
        tasks[info.instruction].append(i)
    return dict(tasks)


def progress_plan(infos: Sequence[Any]) -> tuple[list[int], dict[str, int]]:
    """Which successes get the progress metric, and how many were skipped and why."""
    chosen, skipped = [], {"shorter than 8 frames": 0, "no other success in the task": 0}
    for indices in group_by_task(infos).values():
        successes = [i for i in indices if infos[i].success]
        for i in successes:
            if infos[i].length < MIN_PROGRESS_LENGTH:
                skipped["shorter than 8 frames"] += 1
            elif len(successes) < 2:
                skipped["no other success in the task"] += 1
            else:
                chosen.append(i)
    return chosen, skipped


def embed_videos(
    encoder: Any,
    infos: Sequence[Any],
    progress_ids: Sequence[int],
    max_frames: int,
    batch_size: int,
) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Embed every video whole, and the videos ``progress_ids`` at every prefix fraction.

    Returns:
        (N, D) full-video embeddings, and ``{video: (len(FRACTIONS), D)}`` prefix embeddings
        (the last fraction, 1.0, is the whole video).
    """
    from tqdm import tqdm

    from embodied_rl.data.episode_videos import read_clip

    batcher = Batcher(encoder, batch_size)
    wanted = set(progress_ids)
    for i, info in enumerate(tqdm(infos, desc="videos", unit="video", disable=None)):
        read = read_indices(info.length, max_frames)
        clip = read_clip(info, read)
        batcher.add((i, None), clip, len(clip))
        if i in wanted:
            for k, fraction in enumerate(FRACTIONS[:-1]):
                batcher.add((i, k), clip, prefix_length(read, info.length, fraction))
    out = batcher.finish()
    full = np.stack([out[(i, None)] for i in range(len(infos))])
    last = len(FRACTIONS) - 1
    prefixes = {
        i: np.stack([out[(i, k)] if k < last else full[i] for k in range(len(FRACTIONS))])
        for i in progress_ids
    }
    return full, prefixes


def evaluate_encoder(
    spec: EncoderSpec, infos: Sequence[Any], args: argparse.Namespace
) -> dict[str, Any]:
    """Both metrics of one encoder on ``infos`` (see the module docstring)."""
    started = time.perf_counter()
    encoder = build_encoder(spec, args.device)
    progress_ids, skipped = progress_plan(infos)
    full, prefixes = embed_videos(encoder, infos, progress_ids, args.max_frames, args.batch_size)
    success = np.array([info.success for info in infos], dtype=bool)
    groups = group_by_task(infos)
    result: dict[str, Any] = {
        "label": spec.label,
        "encoder": spec.name,
        "options": spec.options,
        "embedding_dim": int(full.shape[1]),
    }
    result.update(separation({k: (full[ix], success[ix]) for k, ix in groups.items()}))
    curves = []
    for i in progress_ids:
        ix = groups[infos[i].instruction]
        curves.append(progress_distances(prefixes[i], full[ix], success[ix], ix.index(i)))
    result["progress"] = {**progress_summary(curves, FRACTIONS), "skipped": skipped}
    result["failure_ranking"] = rank_failures(full, infos, groups)
    result["seconds"] = time.perf_counter() - started
    del encoder
    _free_device_memory()
    return result


def _free_device_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- report


def table_row(result: dict[str, Any]) -> dict[str, Any]:
    """The printed row of one encoder's result."""
    prog = result["progress"]
    rho = (
        "-"
        if prog["spearman_mean"] is None
        else f"{prog['spearman_mean']:.3f}±{prog['spearman_std']:.3f} (n={prog['episodes']})"
    )
    return {
        "encoder": result["label"],
        "tasks_scored": result["tasks_scored"],
        "episodes": result["episodes"],
        "successes": result["successes"],
        "failures": result["failures"],
        "pooled_auc": result["pooled_auc"],
        "mean_task_auc": result["mean_task_auc"],
        "progress_spearman": rho,
        "failure_spearman": _failure_cell(result.get("failure_ranking")),
        "seconds": result["seconds"],
    }


def _failure_cell(ranking: dict[str, Any] | None) -> str:
    """``rho [low, high] (n=F)``: the pooled failure ranking with its 95% interval."""
    if ranking is None or ranking["pooled_spearman"] is None:
        return "-"
    low, high = ranking["pooled_interval"] or (float("nan"), float("nan"))
    rho, count = ranking["pooled_spearman"], ranking["failures_ranked"]
    return f"{rho:.3f} [{low:.3f}, {high:.3f}] (n={count})"


def plot(results: Sequence[dict[str, Any]], out: Path) -> Path:
    """Two panels: AUC per encoder (pooled and mean per task); mean normalised distance to
    the other successes vs the fraction of the episode seen."""
    from matplotlib.patches import Patch

    fig, (left, right) = common.new_figure(ncols=2)
    nan = lambda v: float("nan") if v is None else v  # noqa: E731
    for k, r in enumerate(results):
        color = f"C{k % 10}"  # the encoder's colour in both panels
        left.bar(k - 0.2, nan(r["pooled_auc"]), 0.4, color=color)
        left.bar(k + 0.2, nan(r["mean_task_auc"]), 0.4, color=color, alpha=0.45, hatch="//")
        prog = r["progress"]
        if prog["curve_mean"] is not None:
            right.plot(prog["fractions"], prog["curve_mean"], "o-", color=color, label=r["label"])
    left.axhline(0.5, color="grey", linestyle="--", linewidth=1)
    # more than three names side by side overlap: slant them
    slant = {"rotation": 25, "ha": "right"} if len(results) > 3 else {}
    left.set_xticks(range(len(results)), [r["label"] for r in results], **slant)
    left.set_ylim(0, 1.2)
    left.set_yticks(np.linspace(0, 1, 6))
    left.set_ylabel("AUC: success vs failure (0.5 = chance)")
    left.set_title("Separation (leave-one-out centroid)")
    kinds = [
        Patch(facecolor="grey", label="pooled over tasks"),
        Patch(facecolor="grey", alpha=0.45, hatch="//", label="mean per task"),
    ]
    left.legend(handles=kinds, loc="upper center", ncol=2, fontsize="small")
    right.set_xlabel("fraction of the successful episode seen")
    right.set_ylabel("distance / episode's max distance")
    right.set_title("Progress: distance to the other successes")
    right.legend(loc="lower left")
    return common.save_figure(fig, out.stem, out.parent)


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--videos", nargs="+", required=True, help="episode video / LIBERO demo files or folders"
    )
    parser.add_argument(
        "--encoder",
        action="append",
        dest="encoders",
        metavar="SPEC",
        help=f"repeatable; {SPEC_HELP} (default: pooled=video_encoder.cheap)",
    )
    parser.add_argument("--heldout-every", type=int, default=5)
    parser.add_argument(
        "--split",
        default="validation",
        choices=["validation", "test", "all"],
        help="videos by init state; those without one only under 'all'",
    )
    parser.add_argument("--max-frames", type=int, default=128, help="frames read per video")
    parser.add_argument("--batch-size", type=int, default=8, help="clips per encoder call")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument(
        "--out", type=Path, default=common.RESULTS_DIR / f"{NAME}.json", help="JSON path"
    )
    args = parser.parse_args(argv)
    try:
        args.specs = [
            parse_encoder_spec(s) for s in args.encoders or ["pooled=video_encoder.cheap"]
        ]
    except EncoderSpecError as err:
        parser.error(str(err))
    labels = [s.label for s in args.specs]
    if len(set(labels)) != len(labels):
        parser.error(f"--encoder labels must differ, got {labels}")
    if args.max_frames < 1 or args.batch_size < 1:
        parser.error("--max-frames and --batch-size must be >= 1")
    if args.split != "all" and args.heldout_every < 1:
        parser.error(f"--split {args.split} needs --heldout-every >= 1 (or use --split all)")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def load_videos(args: argparse.Namespace) -> tuple[list[Any], dict[str, Any]]:
    """The selected videos and what the selection did (counts)."""
    from embodied_rl.data.episode_videos import scan_videos

    infos = scan_videos(args.videos)
    selected, no_init = select_videos(infos, args.split, args.heldout_every)
    facts = {
        "scanned": len(infos),
        "selected": len(selected),
        "without_init_state": no_init,
        "tasks": len(group_by_task(selected)),
        "successes": sum(i.success for i in selected),
    }
    if not selected:
        raise SystemExit(
            f"no video of split {args.split!r} (heldout_every={args.heldout_every}) among "
            f"{len(infos)} scanned ({no_init} without an init state); use --split all, another "
            "--heldout-every, or other --videos"
        )
    return selected, facts


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    infos, facts = load_videos(args)
    print(
        f"{facts['selected']} videos of split {args.split} ({facts['tasks']} tasks, "
        f"{facts['successes']} successes) of {facts['scanned']} scanned",
        flush=True,
    )
    results = []
    for spec in args.specs:
        try:
            results.append(evaluate_encoder(spec, infos, args))
        except EncoderSpecError as err:
            raise SystemExit(str(err)) from None
    rows = [table_row(r) for r in results]
    common.print_table(rows)
    payload = {
        "command": shlex.join(["scripts/bench/world_model_latents.py", *argv]),
        "args": {k: str(v) for k, v in vars(args).items() if k not in ("specs", "encoders")},
        "videos": facts,
        "rows": rows,
        "encoders": results,
    }
    out = args.out.resolve()
    common.write_results(out.stem, payload, out.parent)
    plot(results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
