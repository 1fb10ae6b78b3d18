"""Weak scaling of the databuffer vs a central controller, and a cost model projected to 1024.

What is measured, for ``N`` = 2, 4, 8, 16 worker processes (Ray actors in one gloo world on
this machine) at a FIXED per-worker batch (weak scaling): the layout change of
docs/ARCHITECTURE.md, "How a batch moves between workers" (rollout as dp N/2 x tp 2 ->
training as dp N) of an LLM-RL batch (``databuffer.py``'s ``text``
variant: prompts of 256, responses of 512 tokens, groups of 8), ``--rows`` samples per
training worker, at 1x and 4x that size.

- ``ours``: every worker calls ``redistribute`` (shared memory between ranks of one node,
  which all are here); ``ours-a2a``: the same with the gloo ``all_to_all`` transport used
  between nodes.
- ``central``: a single controller gathers every shard on the driver, splits and scatters
  (``databuffer.py``'s ``central`` method on N workers).

Per point: median seconds of ``--repeats`` transfers after a warm-up; payload bytes each worker
sent plus received (``TransferStats``; central: its shard up plus its part down); the
driver's RSS after the workers started and its peak increase during a transfer; launch time
(actors created and the gloo world joined). Every transfer is checked: each sample id arrives
exactly once.

The cost model (fitted by least squares on these measurements) is, per transfer::

    ours:    t = a + b * (N - 1) + s / B   s = most bytes a worker moves (sent + received)
    central: t = a + b * N       + d / B   d = 2 * N * part: the driver receives and sends all

``a``: fixed cost, ``b``: cost per peer (one message each way per peer in an all-to-all),
``B``: bandwidth. The projection keeps ``a`` and ``b`` (software costs per transfer and per
peer) and replaces ``B`` with a stated cluster: 8 workers (GPUs) per node, 200 Gb/s per node
between nodes, ours crossing nodes for the share ``1 - 8/N`` of its bytes through a NIC shared
by 8 workers, central through the driver's one NIC. Beside it, siiRL's published figures.

Run (about 10 minutes on 2 cores; writes docs/benchmarks/scaling.{json,png})::

    .venv/bin/python scripts/bench/scaling.py
    .venv/bin/python scripts/bench/scaling.py --workers 2 4 --repeats 1 --out /tmp/scaling
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import common  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from databuffer import (  # noqa: E402
    Variant,
    central_transfer,
    free_port,
    make_samples,
    release_free_memory,
)
from tensordict import TensorDict  # noqa: E402

from embodied_rl import keys as K  # noqa: E402
from embodied_rl.data.batch import tensor_keys  # noqa: E402
from embodied_rl.data.databuffer import redistribute  # noqa: E402
from embodied_rl.data.layout import Layout  # noqa: E402
from embodied_rl.data.transport import AllToAllTransport, TransferStats  # noqa: E402

NAME = "scaling"
TIMEOUT_S = 600
METHODS = ("ours", "ours_a2a", "central")
SIZES = (1, 4)  # per-worker batch: --rows and 4x --rows
PROJECTED = (64, 128, 256, 512, 1024)
CLUSTER = {"workers_per_node": 8, "node_link_gbit_s": 200.0}
SIIRL = (
    "siiRL (arXiv 2507.13833): up to 2.62x the throughput of verl's single controller, "
    "near-linear scaling to 1024 GPUs"
)


def layouts(n: int) -> tuple[Layout, Layout]:
    """Rollout as dp n/2 x tp 2 -> training as dp n, on ranks 0..n-1."""
    ranks = tuple(range(n))
    return Layout(ranks, tp_size=2), Layout(ranks)


def variant(rows: int) -> Variant:
    return Variant("text", base=rows, group_size=8, length=256, width=512)


@ray.remote(num_cpus=0.1)
class ScaleWorker:
    """One rank: holds a source shard, moves it with the databuffer or through the driver."""

    def __init__(self, rank: int, world: int) -> None:
        torch.set_num_threads(1)
        self.rank, self.world = rank, world
        self.batch: TensorDict | None = None
        self.received: TensorDict | None = None

    def setup(self, port: int) -> int:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=self.rank,
            world_size=self.world, timeout=timedelta(seconds=TIMEOUT_S),
        )  # fmt: skip
        self.group = dist.new_group(list(range(self.world)))
        return os.getpid()

    def build(self, rows_per_worker: int) -> int:
        """This rank's source shard: ``2 * rows`` samples per dp shard, contiguous ids."""
        self.batch = self.received = None
        gc.collect()
        release_free_memory()
        src, _ = layouts(self.world)
        per_shard = rows_per_worker * self.world // src.dp_size
        start = src.dp_rank(self.rank) * per_shard
        ids = torch.arange(start, start + per_shard, dtype=torch.int64)
        self.batch = make_samples(variant(rows_per_worker), ids)
        return sum(self.batch.get(k).nbytes for k in tensor_keys(self.batch))

    def ours(self, collective: bool) -> dict:
        """Redistribute; returns the transfer stats and this process's CPU seconds for it."""
        src, dst = layouts(self.world)
        stats = TransferStats()
        transport = AllToAllTransport(self.group) if collective else None
        cpu = time.process_time()
        self.received = redistribute(
            self.batch, src, dst, self.rank, self.group, transport=transport, stats=stats
        )
        return {**asdict(stats), "cpu_s": time.process_time() - cpu}

    def shard(self) -> TensorDict:
        return self.batch

    def receive(self, part: TensorDict) -> bool:
        self.received = part
        return True

    def received_ids(self) -> list[int]:
        ids = [] if self.received is None else self.received[K.SAMPLE_ID].tolist()
        self.received = None
        return ids


def timed(method: str, workers: list, n: int) -> tuple[float, float, float, list[dict]]:
    """One transfer: (wall seconds, busiest process's CPU seconds, driver RSS peak increase
    MiB, per-worker stats of ours). CPU seconds: the most any one worker spent (ours) or the
    driver (central): the wall time of that process when it has a core of its own, which on
    a cluster it has, and here, with up to 16 processes on 2 cores, it does not."""
    release_free_memory()
    with common.PeakRss() as driver:
        started, cpu = time.perf_counter(), time.process_time()
        if method == "central":
            central_transfer(workers, True, *layouts(n))
            stats: list[dict] = []
        else:
            refs = [w.ours.remote(method == "ours_a2a") for w in workers]
            stats = ray.get(refs, timeout=TIMEOUT_S)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    busiest = cpu if method == "central" else max(s["cpu_s"] for s in stats)
    return seconds, busiest, driver.peak_mb - driver.start_mb, stats


def check_delivery(workers: list, total: int) -> None:
    got = sorted(i for ids in ray.get([w.received_ids.remote() for w in workers]) for i in ids)
    if got != list(range(total)):
        raise RuntimeError(f"{len(got)} samples arrived, expected each of {total} once")


def measure_world(n: int, rows: int, repeats: int) -> list[dict]:
    """Every method and size at n workers; the actors are started (and timed) once."""
    driver_before = common.rss_mb()
    started = time.perf_counter()
    workers = [ScaleWorker.remote(r, n) for r in range(n)]
    port = free_port()
    ray.get([w.setup.remote(port) for w in workers], timeout=TIMEOUT_S)
    launch_s = time.perf_counter() - started
    driver_after_launch = common.rss_mb()
    points = []
    try:
        for size in SIZES:
            per_worker = rows * size
            shard_bytes = ray.get([w.build.remote(per_worker) for w in workers])
            for method in METHODS:
                runs = []
                for attempt in range(repeats + 1):
                    run = timed(method, workers, n)
                    check_delivery(workers, per_worker * n)
                    if attempt:
                        runs.append(run)
                seconds = statistics.median(r[0] for r in runs)
                cpu_s = statistics.median(r[1] for r in runs)
                part = max(shard_bytes) / 2  # a training worker's rows (a dp shard holds 2x)
                if method == "central":  # leaders send 2 parts up, everyone gets 1 part down
                    moved, driver_bytes = 2 * part, 2 * n * part
                else:
                    moved = max(s["bytes_sent"] + s["bytes_received"] for s in runs[-1][3])
                    driver_bytes = 0.0
                points.append(
                    {
                        "workers": n, "size": size, "rows_per_worker": per_worker,
                        "method": method, "seconds": seconds,
                        "seconds_all": [r[0] for r in runs],
                        "busiest_cpu_s": cpu_s,
                        "bytes_per_worker": float(moved),
                        "driver_bytes": float(driver_bytes),
                        "driver_peak_increase_mb": max(r[2] for r in runs),
                        "driver_rss_mb": driver_after_launch,
                        "driver_launch_increase_mb": driver_after_launch - driver_before,
                        "launch_s": launch_s,
                    }
                )  # fmt: skip
                print(f"  N={n:>2} {size}x {method:<8} {seconds * 1e3:8.1f} ms wall, "
                      f"{cpu_s * 1e3:8.1f} ms CPU", flush=True)  # fmt: skip
    finally:
        for w in workers:
            ray.kill(w)
    return points


# ----------------------------------------------------------------------------- the model
def fit(points: list[dict], method: str) -> dict[str, float]:
    """Least-squares ``a``, ``b`` (per peer) and ``B`` (bytes/s) of the method's model."""
    rows = [p for p in points if p["method"] == method]
    n = np.array([p["workers"] for p in rows], dtype=float)
    t = np.array([p["busiest_cpu_s"] for p in rows])
    peers = n if method == "central" else n - 1
    key = "driver_bytes" if method == "central" else "bytes_per_worker"
    volume = np.array([p[key] for p in rows], dtype=float)
    design = np.stack([np.ones_like(n), peers, volume], axis=1)
    (a, b, inverse_bw), *_ = np.linalg.lstsq(design, t, rcond=None)
    predicted = design @ np.array([a, b, inverse_bw])
    error = float(np.max(np.abs(predicted - t) / t))
    return {"a_s": float(a), "b_s_per_peer": float(b), "bandwidth_gb_s": 1e-9 / inverse_bw
            if inverse_bw > 0 else float("inf"), "max_relative_error": error}  # fmt: skip


def project(model: dict[str, float], method: str, n: int, part: float) -> float:
    """Seconds per transfer at ``n`` workers on the stated cluster (``CLUSTER``), each
    training worker receiving ``part`` bytes (and, in ours, sending about as much)."""
    per_node = CLUSTER["workers_per_node"]
    link = CLUSTER["node_link_gbit_s"] / 8 * 1e9  # bytes/s of one node's NIC
    if method == "central":
        return model["a_s"] + model["b_s_per_peer"] * n + 2 * n * part / link
    cross = max(0.0, 1.0 - per_node / n) * 2 * part  # the share of a worker's bytes leaving
    return model["a_s"] + model["b_s_per_peer"] * (n - 1) + cross / (link / per_node)


def projection_rows(models: dict[str, dict], points: list[dict]) -> list[dict]:
    """Projected seconds per transfer, ours vs central, for the 1x per-worker batch."""
    first = next(p for p in points if p["size"] == 1 and p["method"] == "central")
    part = first["driver_bytes"] / (2 * first["workers"])
    rows = []
    for n in PROJECTED:
        ours = project(models["ours_a2a"], "ours", n, part)
        central = project(models["central"], "central", n, part)
        rows.append({"workers": n, "ours_s": ours, "central_s": central,
                     "central_over_ours": central / ours})  # fmt: skip
    return rows


def plot(points: list[dict], projection: list[dict], out: Path) -> Path:
    fig, axes = common.new_figure(ncols=3, width=5.0, height=3.8)
    for method in METHODS:
        for size, style in zip(SIZES, ("-", "--")):
            rows = [p for p in points if p["method"] == method and p["size"] == size]
            xs = [p["workers"] for p in rows]
            axes[0].plot(xs, [p["busiest_cpu_s"] * 1e3 for p in rows], style, marker="o",
                         label=f"{method} {size}x")  # fmt: skip
            if size == 4:
                axes[1].plot(xs, [p["driver_peak_increase_mb"] for p in rows], marker="o",
                             label=f"{method} {size}x")  # fmt: skip
    axes[0].set(xscale="log", xlabel="workers (weak scaling)", title="CPU ms per transfer",
                ylabel="busiest process (worker or driver)")  # fmt: skip
    axes[1].set(xscale="log", xlabel="workers", ylabel="MiB",
                title="Driver RSS increase during a transfer")  # fmt: skip
    xs = [r["workers"] for r in projection]
    axes[2].plot(xs, [r["ours_s"] for r in projection], marker="o", label="ours (model)")
    axes[2].plot(xs, [r["central_s"] for r in projection], marker="o", label="central (model)")
    axes[2].set(xscale="log", yscale="log", xlabel="workers (8 per node, 200 Gb/s)",
                ylabel="s per transfer", title="Projection")  # fmt: skip
    for ax, ticks in zip(axes, ([2, 4, 8, 16], [2, 4, 8, 16], xs)):
        ax.set_xticks(ticks)
        ax.get_xaxis().set_major_formatter("{x:g}")
        ax.get_xaxis().set_minor_formatter("")
        ax.legend(fontsize=7)
    return common.save_figure(fig, NAME, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--rows", type=int, default=32, help="samples per training worker (1x)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args(argv)
    if any(n < 2 or n % 2 for n in args.workers):
        parser.error("--workers must be even numbers >= 2 (the rollout layout has tp 2)")
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
             log_to_driver=False)  # fmt: skip
    started = time.perf_counter()
    points: list[dict] = []
    try:
        for n in args.workers:
            points += measure_world(n, args.rows, args.repeats)
    finally:
        ray.shutdown()
    models = {m: fit(points, m) for m in METHODS}
    projection = projection_rows(models, points)
    shown = ("workers", "size", "method", "seconds", "busiest_cpu_s", "bytes_per_worker",
             "driver_peak_increase_mb", "driver_rss_mb", "launch_s")  # fmt: skip
    common.print_table([{k: p[k] for k in shown} for p in points])
    common.print_table([{"method": m, **v} for m, v in models.items()])
    common.print_table(projection)
    payload = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "points": points,
        "models": models,
        "cluster": CLUSTER,
        "projection": projection,
        "siirl": SIIRL,
        "wall_seconds": time.perf_counter() - started,
    }
    common.write_results(NAME, payload, args.out)
    plot(points, projection, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
