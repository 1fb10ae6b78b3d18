"""The comparison of ``grpo_vs_trl``: per-step phases, summaries, checks, tables and the plot.

Reads what the two training subprocesses left (their phase events, metrics / log history and
set-up checks) in the parent. ``grpo_vs_trl.py``'s docstring says what every number means.
"""

from __future__ import annotations

from pathlib import Path
from statistics import fmean as mean
from typing import Any

import common
from grpo_vs_trl_setup import NAME

TARGET_SPEEDUP = 1.5
WARMUP_STEPS = 1
PER_STEP_KEYS = ("period", "cpu_period", "generate", "logprob", "update", "tokens", "reward")
LOGPROB_TOLERANCE = 1e-4
SYSTEMS = {"ours": "ours (grpo_llm, 1 worker)", "trl": "TRL 1.16 GRPOTrainer"}
TABLE_COLUMNS = {  # table column -> summary key
    "s/step": "s_per_step", "CPU s/step": "cpu_s_per_step", "generate s": "generate_s",
    "logprob s": "logprob_s", "update s": "update_s", "other s": "other_s",
    "gen tok/s": "gen_tokens_per_s", "peak RSS MB (compute)": "peak_rss_compute_mb",
    "peak RSS MB (tree)": "peak_rss_tree_mb", "reward first-5": "reward_first5",
    "reward last-10": "reward_last10",
}  # fmt: skip
PHASE_COLORS = {
    "generate": "#4c72b0",
    "logprob": "#dd8452",
    "update": "#55a868",
    "other": "#8c8c8c",
}


# ---------------------------------------------------------------------- parent: analysis
def step_rows(events: list[dict], steps: int) -> list[dict[str, Any]]:
    """Per-step sums of one run's phase events."""
    rows = [
        {"generate": 0.0, "logprob": 0.0, "update": 0.0, "tokens": 0, "rows": 0, "digests": []}
        | {"token_ids": set(), "end": None, "reward": None, "reward_count": None}
        for _ in range(steps)
    ]
    for event in events:
        if not 0 <= event["step"] < steps:
            raise SystemExit(f"phase event outside the training steps: {event}")
        row, kind = rows[event["step"]], event["event"]
        if kind == "generate":
            row["generate"] += event["seconds"]
            row["tokens"] += event["tokens"]
            row["rows"] += event["rows"]
            row["digests"] += event["prompt_digests"]
            row["token_ids"] |= set(event["token_ids"])
        elif kind in ("logprob", "update"):
            row[kind] += event["seconds"]
        elif kind == "reward":
            row["reward"], row["reward_count"] = event["mean"], event["count"]
        elif kind == "step_end":
            row["end"], row["cpu"] = event["t"], event["cpu"]
    return rows


def run_steps(side: str, run: dict, steps: int) -> list[dict[str, Any]]:
    """Per-step phases of one run, completed from the system's own logs."""
    rows = step_rows(run["events"], steps)
    if side == "ours":
        metrics = run["result"]["metrics"]
        for row, m in zip(rows, metrics):
            row["update"], row["reward"] = m["time/train"], m["reward/mean"]
            row["time_step"] = m["time/step"]  # the walk only, without metric logging
            row["reported_tokens"] = m["rollout/response_length"] * row["rows"]
        logged = len(metrics)
    else:
        history = run["result"]["log_history"]
        for row, h in zip(rows, history):
            row["reported_tokens"] = h["completions/mean_length"] * row["rows"]
            row["reported_reward"] = h["reward"]
        logged = len(history)
    if logged != steps or any(row["end"] is None for row in rows):
        raise SystemExit(f"{side} seed {run['seed']}: {logged} logged steps, expected {steps}")
    for k in range(1, steps):
        rows[k]["period"] = rows[k]["end"] - rows[k - 1]["end"]
        rows[k]["cpu_period"] = rows[k]["cpu"] - rows[k - 1]["cpu"]
    return rows


def run_checks(side: str, rows: list[dict], expected_rows: int, allowed: set | None) -> dict:
    """Each run: full batches, hooks agree with the system's own logs, constraint held."""
    checks = {
        "rows_per_step": all(r["rows"] == expected_rows for r in rows),
        "tokens_match_own_logs": all(abs(r["tokens"] - r["reported_tokens"]) < 0.5 for r in rows),
        "allowed_tokens_only": allowed is None or all(r["token_ids"] <= allowed for r in rows),
    }
    if side == "trl":
        checks["rewards_match_own_logs"] = all(
            r["reward_count"] == expected_rows and abs(r["reward"] - r["reported_reward"]) < 1e-6
            for r in rows
        )
    return checks


def summarize(per_seed: list[list[dict]], runs: list[dict]) -> dict[str, Any]:
    """Means over the measured steps of all seeds; the mean reward curve over seeds."""
    measured = [r for rows in per_seed for r in rows[WARMUP_STEPS:]]
    parts = {
        key: mean(r[key] for r in measured)
        for key in ("period", "cpu_period", "generate", "logprob", "update")
    }
    curves = [[r["reward"] for r in rows] for rows in per_seed]
    curve = [mean(values) for values in zip(*curves)]
    summary = {
        "s_per_step": parts["period"],
        "cpu_s_per_step": parts["cpu_period"],
        "generate_s": parts["generate"],
        "logprob_s": parts["logprob"],
        "update_s": parts["update"],
        "other_s": parts["period"] - parts["generate"] - parts["logprob"] - parts["update"],
        "gen_tokens_per_s": sum(r["tokens"] for r in measured)
        / sum(r["generate"] for r in measured),
        "gen_tokens_per_step": mean(r["tokens"] for r in measured),
        "peak_rss_compute_mb": max(run["peak_rss_compute_mb"] for run in runs),
        "peak_rss_tree_mb": max(run["peak_rss_tree_mb"] for run in runs),
        "reward_first5": mean(curve[:5]),
        "reward_last10": mean(curve[-10:]),
        "reward_curve": curve,
        "reward_curves_per_seed": curves,
        "per_step_per_seed": [
            [{k: r[k] for k in PER_STEP_KEYS if k in r} for r in rows] for rows in per_seed
        ],
        "wall_s_per_run": [run["wall_s"] for run in runs],
    }
    if "time_step" in measured[0]:
        summary["metrics_time_step_s"] = mean(r["time_step"] for r in measured)
    return summary


def pair_checks(ours_rows: list[dict], trl_rows: list[dict], setup: dict) -> dict[str, bool]:
    """One seed: same prompts every step, and TRL's set-up checks (weights, distribution...)."""
    same_prompts = all(
        sorted(a["digests"]) == sorted(b["digests"]) for a, b in zip(ours_rows, trl_rows)
    )
    return {
        "same_prompts_every_step": same_prompts,
        "equal_initial_weights": setup["equal_initial_weights"],
        "same_samples_same_seed": setup["same_samples"],
        "logprobs_equal": setup["logprob_max_abs_diff"] < LOGPROB_TOLERANCE,
        "prompts_fit": setup["max_prompt_tokens"] <= setup["max_prompt_length"],
        "optimizer_matches": setup["optimizer_matches"],
    }


def analyse(runs: dict[str, list[dict]], steps: int) -> dict[str, Any]:
    """Summaries per system, targets, and every correctness check."""
    trl_setup = [run["result"]["checks"] for run in runs["trl"]]
    expected_rows = trl_setup[0]["expected_rows"]
    allowed = set(trl_setup[0]["allowed_ids"]) if trl_setup[0]["allowed_ids"] else None
    rows = {side: [run_steps(side, run, steps) for run in runs[side]] for side in SYSTEMS}
    checks: dict[str, Any] = {}
    for side in SYSTEMS:
        for run, seed_rows in zip(runs[side], rows[side]):
            for name, ok in run_checks(side, seed_rows, expected_rows, allowed).items():
                checks[f"{side}_seed{run['seed']}_{name}"] = ok
    for ours_rows, trl_rows, run in zip(rows["ours"], rows["trl"], runs["trl"]):
        for name, ok in pair_checks(ours_rows, trl_rows, run["result"]["checks"]).items():
            checks[f"seed{run['seed']}_{name}"] = ok
    summary = {side: summarize(rows[side], runs[side]) for side in SYSTEMS}
    speedup = summary["trl"]["s_per_step"] / summary["ours"]["s_per_step"]
    targets = {
        "speedup": speedup,
        "speedup_met": speedup >= TARGET_SPEEDUP,
        "reward_last10_met": summary["ours"]["reward_last10"] >= summary["trl"]["reward_last10"],
    }
    details = {"logprob_max_abs_diff": [c["logprob_max_abs_diff"] for c in trl_setup]}
    details["trl_optimizer"] = trl_setup[0]["optimizer"]
    return {"summary": summary, "targets": targets, "checks": checks, "details": details}


# ---------------------------------------------------------------------- parent: report
def tables(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per-system numbers and the target table (with its met column)."""
    s, t = report["summary"], report["targets"]
    systems = [
        {"system": SYSTEMS[side], **{column: v[key] for column, key in TABLE_COLUMNS.items()}}
        for side, v in s.items()
    ]
    targets = [
        {
            "target": f"ours >= {TARGET_SPEEDUP}x faster per step",
            "ours": s["ours"]["s_per_step"],
            "TRL": s["trl"]["s_per_step"],
            "ratio": f"{t['speedup']:.2f}x",
            "met": "yes" if t["speedup_met"] else "NO",
        },
        {
            "target": "ours reward last-10 >= TRL's",
            "ours": s["ours"]["reward_last10"],
            "TRL": s["trl"]["reward_last10"],
            "ratio": f"{s['ours']['reward_last10'] - s['trl']['reward_last10']:+.3f}",
            "met": "yes" if t["reward_last10_met"] else "NO",
        },
    ]
    return {"systems": systems, "targets": targets}


def plot(report: dict[str, Any], out_dir: Path) -> None:
    """Reward curves (seeds thin, mean thick) and the stacked time split per step."""
    fig, (rewards, times) = common.new_figure(2, width=5.6, height=3.8)
    colors = {"ours": "tab:blue", "trl": "tab:orange"}
    for side, values in report["summary"].items():
        for curve in values["reward_curves_per_seed"]:
            rewards.plot(curve, color=colors[side], alpha=0.35, lw=0.8)
        rewards.plot(values["reward_curve"], color=colors[side], lw=2, label=SYSTEMS[side])
    rewards.set(xlabel="step", ylabel="reward/mean", title="Reward per step (thin: seeds)")
    rewards.xaxis.get_major_locator().set_params(integer=True)
    rewards.legend(fontsize=8)
    bottom = [0.0, 0.0]
    for phase, color in PHASE_COLORS.items():
        heights = [max(report["summary"][side][f"{phase}_s"], 0.0) for side in SYSTEMS]
        times.bar(range(2), heights, bottom=bottom, color=color, label=phase, width=0.55)
        bottom = [b + h for b, h in zip(bottom, heights)]
    speedup, met = report["targets"]["speedup"], report["targets"]["speedup_met"]
    times.set_xticks(range(2), ["ours", "TRL"])
    verdict = "met" if met else "NOT met"
    title = f"Step time: TRL / ours = {speedup:.2f} (target >= {TARGET_SPEEDUP}: {verdict})"
    times.set(ylabel="seconds per step", title=title)
    times.legend(fontsize=8)
    common.save_figure(fig, NAME, out_dir)
