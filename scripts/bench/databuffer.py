"""Databuffer redistribution: our distributed databuffer vs a central controller vs memcpy.

What is measured: moving one step's batch of ``B`` samples between two data-parallel layouts
on real Ray actors, the transfer the DAG planner inserts where consecutive nodes are laid out
differently. The layout change is the one of docs/ARCHITECTURE.md ("How a batch moves
between workers"): rollout on 4 workers as
dp 2 x tp 2 (both tensor-parallel members of a shard hold the same samples; only the shard
leaders, ranks 0 and 2, send) -> training on the same 4 workers as dp 4. Two batches:

- ``text``: an LLM-RL batch with the trainer's keys (``SAMPLE_ID``, ``GROUP_ID``, prompt and
  response token ids and masks, ``OLD_LOGPROBS``, ``ADVANTAGES``, ``REWARDS``), prompts of
  512 and responses of 1536 tokens with per-sample real lengths, GRPO groups of 8.
- ``image``: an embodied trajectory batch as ``rollout.env`` writes it (``OBS_IMAGE``
  ``(B, 16, 224, 224, 3)`` uint8, ``OBS_STATE``, ``ACTION_TOKENS``, ``STEP_MASK``, per-token
  ``OLD_LOGPROBS`` / ``RESPONSE_MASK`` / ``ADVANTAGES``, ...), groups of 4.

Five ways to move it, for batch sizes 1x, 2x, 4x and 8x of a base:

1. ``ours``: every worker calls :func:`embodied_rl.data.databuffer.redistribute` (metadata
   all-gather, token-balanced assignment with groups kept whole, payload through the default
   transport: shared-memory segments, since all ranks share this machine), exactly as
   ``PlanExecutor`` does in a DAG worker. ``ours-a2a``: the same with the gloo
   ``all_to_all_single`` transport that is used across machines (TCP loopback here).
2. ``central``: what single-controller frameworks do. The driver ``ray.get``s each producer
   shard (shard leaders only), concatenates them, splits the batch into 4 equal parts and
   hands each consumer its part as an actor-method argument (``ray.put`` once per part),
   with Ray's default serialization of the batch (a ``TensorDict``; tensors are pickled
   through torch, as verl's ``DataProto`` does). Each part is copied before sending: a slice
   would pickle the whole batch's storage.
3. ``central-zc``: the same controller with zero-copy tensors, a stronger reference on one
   machine: tensors go through Ray as numpy buffers (``ray.util.register_serializer`` in every
   sender), which consumers read in place from the shared-memory object store; parts are
   not copied. Consumers then hold read-only tensors.
4. ``memcpy``: the physical limit, after Ray is shut down: the driver process (one thread)
   copies every tensor of the full batch into a fresh tensor (``torch.empty_like(x).copy_(x)``).

Timing: the same 4 actors (one gloo world, made once) serve the four Ray methods, so start-up
is excluded. Each producer builds its shard locally before the clock starts; the clock runs from
"all shards ready" until every consumer has acknowledged holding its part (``ray.get`` of the
acks). One warm-up, then the median of ``--repeats`` (3). GB/s = payload bytes of the full
batch (all tensor fields, 10^9 bytes per GB) / seconds, the same for all four methods.

Memory: the driver's RSS is sampled every 5 ms during each timed run (``common.PeakRss``) and
reported as the increase over its value at the start of the run (before each run freed heap
memory goes back to the OS with ``malloc_trim``, so reused memory cannot hide an allocation).
Each worker's RSS is sampled from the driver (psutil on the actor pids, every 10 ms); the
table reports the maximum over workers of the absolute peak. "driver flat" means the driver
grew by at most 16 MiB, whatever the batch size (a central driver holds the whole batch).

Correctness, checked after every timed run (outside the clock): each consumer compares the
sample ids it holds with the expected ones (ours: the token-balanced assignment recomputed
independently with ``assign_units`` over whole groups; central: the contiguous equal split)
and compares every field of every row with the sample rebuilt from its id.

Targets (issue 5): ours >= 2x ``central``, ours >= 1/3 of memcpy, driver flat; the table also
says whether ours reaches 2x ``central-zc``. Everything runs on one machine, where Ray's object
store is shared memory and gloo goes through TCP loopback; across machines the central
driver's link carries the whole batch twice, which this benchmark cannot show.

Run (full: 8x moves about 300 MiB per batch; 3-5 minutes on 2 cores; writes
docs/benchmarks/databuffer.{json,png})::

    .venv/bin/python scripts/bench/databuffer.py

Check that it works (tiny sizes, 1-2 minutes, most of it starting Ray)::

    .venv/bin/python scripts/bench/databuffer.py --quick --out /tmp/bench_databuffer
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import socket
import statistics
import time
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import common  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
import ray.util  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from embodied_rl import keys as K  # noqa: E402
from embodied_rl.data.balance import assign_units  # noqa: E402
from embodied_rl.data.batch import concat, make_batch, tensor_keys  # noqa: E402
from embodied_rl.data.databuffer import redistribute  # noqa: E402
from embodied_rl.data.layout import Layout  # noqa: E402
from embodied_rl.data.transport import AllToAllTransport  # noqa: E402

WORLD = 4
SRC = Layout((0, 1, 2, 3), tp_size=2)  # rollout: dp 2 x tp 2
DST = Layout((0, 1, 2, 3))  # training: dp 4
SCALES = (1, 2, 4, 8)
TIMEOUT_S = 300
FLAT_MB = 16.0  # "driver flat": the driver grew by at most this much during a transfer
VOCAB = 151_936  # Qwen2.5 vocabulary size: token ids span the real range
GB = 1e9
METHODS = ("ours", "ours_a2a", "central", "central_zc")
MEMORY_METHODS = ("ours", "central", "central_zc")  # the table's memory columns


# ----------------------------------------------------------------------------- the batches
@dataclass(frozen=True)
class Variant:
    """One kind of batch; every field of sample ``i`` is a deterministic function of ``i``.

    Attributes:
        name: ``text`` or ``image``.
        base: Samples of the 1x batch (a multiple of ``group_size * 4``).
        group_size: Samples per GRPO group (``GROUP_ID`` = sample id // group_size).
        length: Prompt tokens ``P`` (text) or env steps ``T`` (image).
        width: Response tokens ``R`` (text) or image side in pixels (image).
    """

    name: str
    base: int
    group_size: int
    length: int
    width: int


def text_lengths(ids: torch.Tensor, v: Variant) -> tuple[torch.Tensor, torch.Tensor]:
    """Real prompt and response tokens per sample: ``(n,)`` int64 each, varied by id."""
    prompt = v.length // 2 + (ids * 37) % (v.length // 2 + 1)
    response = v.width // 4 + (ids * 101) % (3 * v.width // 4 + 1)
    return prompt, response


def text_samples(ids: torch.Tensor, v: Variant) -> dict[str, torch.Tensor]:
    """An LLM-RL batch: prompt ``(n, P)``, response ``(n, R)`` fields, scalars ``(n,)``."""
    plen, rlen = text_lengths(ids, v)
    p, r = torch.arange(v.length), torch.arange(v.width)
    col = ids[:, None]
    response_mask = (r < rlen[:, None]).float()
    advantage = ((ids % 13).float() - 6.0) / 6.0
    return {
        K.PROMPT_IDS: (col * 7919 + p * 31) % VOCAB,
        K.PROMPT_MASK: (p >= v.length - plen[:, None]).long(),  # left-padded
        K.RESPONSE_IDS: (col * 104_729 + r * 17) % VOCAB,
        K.RESPONSE_MASK: response_mask,
        K.OLD_LOGPROBS: -((col + r) % 97).float() / 16.0 * response_mask,
        K.ADVANTAGES: advantage[:, None] * response_mask,  # broadcast over real tokens
        K.REWARDS: (ids % 2).float(),
    }


ACTION_TOKENS_PER_STEP = 7  # OpenVLA: one token per action dimension
STATE_DIM = 8


def image_steps(ids: torch.Tensor, v: Variant) -> torch.Tensor:
    """Env steps before (and at) the finish of each episode: ``(n,)`` int64."""
    return v.length // 2 + (ids * 13) % (v.length // 2 + 1)


def image_samples(ids: torch.Tensor, v: Variant) -> dict[str, torch.Tensor]:
    """An embodied batch: ``OBS_IMAGE (n, T, W, W, 3)`` uint8 plus per-step/token fields."""
    n, t, k = len(ids), v.length, ACTION_TOKENS_PER_STEP
    steps = image_steps(ids, v)
    step_mask = (torch.arange(t) < steps[:, None]).float()
    token_mask = step_mask.repeat_interleave(k, dim=1)
    pixels = (torch.arange(t * v.width * v.width * 3) % 251).to(torch.uint8)
    # uint8 addition wraps: a per-sample shift of one shared pattern (unique for ids < 256).
    images = pixels[None, :] + ((ids * 29) % 256).to(torch.uint8)[:, None]
    tokens = (ids[:, None] * 31 + torch.arange(t * k)) % 256
    return {
        K.OBS_IMAGE: images.reshape(n, t, v.width, v.width, 3),
        K.OBS_STATE: torch.sin(ids[:, None].double() + torch.arange(t * STATE_DIM))
        .float()
        .reshape(n, t, STATE_DIM),
        K.ACTION_TOKENS: tokens.reshape(n, t, k),
        K.STEP_MASK: step_mask,
        K.OLD_LOGPROBS: -(tokens % 89).float() / 16.0 * token_mask,
        K.RESPONSE_MASK: token_mask,
        K.ADVANTAGES: (((ids % 5).float() - 2.0) / 2.0)[:, None] * token_mask,
        K.FINISH_STEP: steps - 1,
        K.SUCCESS: ids % 3 == 0,
    }


def make_samples(v: Variant, ids: torch.Tensor) -> TensorDict:
    """The batch of sample ids ``ids`` (``(n,)`` int64) of variant ``v``."""
    fields = text_samples(ids, v) if v.name == "text" else image_samples(ids, v)
    fields = {K.SAMPLE_ID: ids.clone(), K.GROUP_ID: ids // v.group_size, **fields}
    return make_batch(fields, batch_size=len(ids))


def token_weight(ids: torch.Tensor, v: Variant) -> torch.Tensor:
    """Real tokens per sample from the construction (what ``token_weights`` reads off masks)."""
    if v.name == "text":
        plen, rlen = text_lengths(ids, v)
        return (plen + rlen).double()
    return (image_steps(ids, v) * ACTION_TOKENS_PER_STEP).double()


def row_bytes(v: Variant) -> int:
    """Payload bytes of one sample: all tensor fields."""
    one = make_samples(v, torch.zeros(1, dtype=torch.int64))
    return sum(one.get(k).nbytes for k in tensor_keys(one))


def source_ids(total: int, dp_rank: int) -> torch.Tensor:
    """Sample ids of source shard ``dp_rank``: contiguous, as a distributed dataloader gives."""
    per = total // SRC.dp_size
    return torch.arange(dp_rank * per, (dp_rank + 1) * per, dtype=torch.int64)


def expected_ours(v: Variant, total: int) -> list[list[int]]:
    """Sample ids per destination dp rank under the databuffer's documented assignment.

    Recomputed independently of ``redistribute``: units are whole groups in order of first
    appearance (source dp order), weighted by real tokens, placed by ``assign_units``; a
    destination keeps the (source dp rank, local index) order, i.e. ascending ids here.
    """
    ids = torch.arange(total, dtype=torch.int64)
    groups = ids // v.group_size
    weights = torch.zeros(int(groups.max()) + 1, dtype=torch.float64)
    weights.index_add_(0, groups, token_weight(ids, v))
    bins = torch.tensor(assign_units(weights.tolist(), DST.dp_size))[groups]
    return [ids[bins == d].tolist() for d in range(DST.dp_size)]


def expected_central(total: int) -> list[list[int]]:
    """Sample ids per destination dp rank under an equal contiguous split."""
    per = total // DST.dp_size
    return [list(range(d * per, (d + 1) * per)) for d in range(DST.dp_size)]


# ----------------------------------------------------------------------------- process helpers
def tensor_to_buffer(tensor: torch.Tensor) -> tuple[np.ndarray, str, tuple[int, ...]]:
    """Zero-copy serializer: a tensor's bytes as a numpy array, which Ray ships out of band."""
    tensor = tensor.detach().contiguous()
    data = tensor.reshape(-1).view(torch.uint8).numpy()
    return data, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)


def tensor_from_buffer(state: tuple[np.ndarray, str, tuple[int, ...]]) -> torch.Tensor:
    """Inverse of :func:`tensor_to_buffer`: a view of the bytes, no copy."""
    data, dtype, shape = state
    with warnings.catch_warnings():
        # Buffers mapped from Ray's object store are read-only; consumers only read them.
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(data)
    return flat.view(getattr(torch, dtype)).reshape(shape)


def set_zero_copy(on: bool) -> None:
    """Serialize tensors sent from this process as numpy buffers (on) or Ray's default (off).

    Ray's default pickles a tensor through torch (the bytes are copied into the pickle and out
    again); numpy arrays are stored out of band and read in place from the shared-memory object
    store. ``ray.util.register_serializer`` is per process, so every sender calls this.
    """
    if on:
        ray.util.register_serializer(
            torch.Tensor, serializer=tensor_to_buffer, deserializer=tensor_from_buffer
        )
    else:
        ray.util.deregister_serializer(torch.Tensor)


def release_free_memory() -> None:
    """Give freed heap memory back to the OS, so that an RSS increase shows new allocations.

    glibc keeps freed chunks (up to 32 MiB each once its mmap threshold has grown) in the heap;
    a later allocation would reuse them without raising RSS.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS increases may be understated
        pass


# ----------------------------------------------------------------------------- the workers
@ray.remote(num_cpus=0.25)
class BenchWorker:
    """One worker of the gloo world: produces a source shard, consumes a destination shard."""

    def __init__(self, rank: int) -> None:
        torch.set_num_threads(1)  # as DAG workers on CPU: 4 workers share 2 cores
        self.rank = rank
        self.batch: TensorDict | None = None
        self.received: TensorDict | None = None

    def pid(self) -> int:
        return os.getpid()

    def zero_copy(self, on: bool) -> None:
        set_zero_copy(on)

    def setup(self, port: int) -> None:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=self.rank,
            world_size=WORLD,
            timeout=timedelta(seconds=TIMEOUT_S),
        )
        # The group the planner creates for a transfer: the union of both layouts' ranks.
        self.group = dist.new_group(sorted(set(SRC.ranks) | set(DST.ranks)))

    def build(self, v: Variant, total: int) -> None:
        """Make this rank's source shard (every tp member of a shard holds the same rows)."""
        self.batch = self.received = None
        gc.collect()
        release_free_memory()
        if self.rank in SRC:
            self.batch = make_samples(v, source_ids(total, SRC.dp_rank(self.rank)))

    def ours(self, collective: bool) -> bool:
        """Our databuffer; returns once this rank holds its destination shard.

        Default transport as in a DAG worker (shared memory: all ranks on one machine), or
        with ``collective`` the gloo ``all_to_all_single`` transport used across machines.
        """
        transport = AllToAllTransport(self.group) if collective else None
        self.received = redistribute(
            self.batch, SRC, DST, self.rank, self.group, transport=transport
        )
        return True

    def shard(self) -> TensorDict:
        """Central baseline, producer side: the driver fetches this shard."""
        return self.batch

    def receive(self, part: TensorDict) -> bool:
        """Central baseline, consumer side: keep the part the driver sent."""
        self.received = part
        return True

    def verify(self, v: Variant, expected_ids: list[int]) -> str | None:
        """Check the received shard against the expected ids and rebuilt rows; then drop it.

        Returns:
            None when correct, else what is wrong.
        """
        got, self.received = self.received, None
        if got is None or K.SAMPLE_ID not in got.keys():
            return f"rank {self.rank}: nothing received"
        ids = got.get(K.SAMPLE_ID).tolist()
        if ids != expected_ids:
            return (
                f"rank {self.rank}: got {len(ids)} ids {ids[:5]}..., expected {expected_ids[:5]}..."
            )
        want = make_samples(v, torch.tensor(ids, dtype=torch.int64))
        if tensor_keys(got) != tensor_keys(want):
            return f"rank {self.rank}: keys {tensor_keys(got)} != {tensor_keys(want)}"
        for key in tensor_keys(want):
            if not torch.equal(got.get(key), want.get(key)):
                return f"rank {self.rank}: field {key!r} differs from the rebuilt samples"
        del got
        release_free_memory()
        return None


# ----------------------------------------------------------------------------- the methods
def ours_transfer(workers: list, collective: bool) -> None:
    """Every worker calls ``redistribute``; returns when all hold their destination shard."""
    ray.get([w.ours.remote(collective) for w in workers], timeout=TIMEOUT_S)


def central_transfer(workers: list, copy_parts: bool, src: Layout = SRC, dst: Layout = DST) -> None:
    """Single controller: gather every shard on the driver, concatenate, split, scatter.

    Args:
        workers: The actors, by rank (``shard()`` and ``receive(part)`` methods).
        copy_parts: Copy each part before sending it. Needed with Ray's default tensor
            pickling, which writes a tensor's whole storage: a slice of the concatenated batch
            would carry the full batch to every consumer (verl consolidates each chunk before
            pickling it: the same one copy). The zero-copy serializer ships only a slice's bytes.
        src / dst: The producer and consumer layouts (default: this benchmark's 4 workers;
            ``scaling.py`` passes its own).
    """
    shards = ray.get([workers[r].shard.remote() for r in src.shard_leaders()], timeout=TIMEOUT_S)
    full = concat(shards)
    per = int(full.batch_size[0]) // dst.dp_size
    parts = [ray.put(part.clone() if copy_parts else part) for part in full.split(per)]
    ray.get(
        [workers[r].receive.remote(parts[dst.dp_rank(r)]) for r in dst.ranks], timeout=TIMEOUT_S
    )


@dataclass
class Run:
    """One timed transfer: seconds and memory (MiB)."""

    seconds: float
    driver_increase_mb: float
    worker_peak_mb: float
    worker_increase_mb: float


def timed_run(transfer: Callable[[], None], pids: list[int]) -> Run:
    """Time ``transfer`` while sampling the driver's and every worker's RSS."""
    with ExitStack() as stack:
        workers = [stack.enter_context(common.PeakRss(pid, interval=0.01)) for pid in pids]
        driver = stack.enter_context(common.PeakRss())
        started = time.perf_counter()
        transfer()
        seconds = time.perf_counter() - started
    return Run(
        seconds=seconds,
        driver_increase_mb=driver.peak_mb - driver.start_mb,
        worker_peak_mb=max(s.peak_mb for s in workers),
        worker_increase_mb=max(s.peak_mb - s.start_mb for s in workers),
    )


def verify(workers: list, v: Variant, expected: list[list[int]], method: str) -> None:
    """Every consumer checks its shard; raises with the consumers' messages on a mismatch."""
    checks = [workers[r].verify.remote(v, expected[DST.dp_rank(r)]) for r in DST.ranks]
    problems = [p for p in ray.get(checks, timeout=TIMEOUT_S) if p is not None]
    if problems:
        raise RuntimeError(f"{method} delivered wrong data ({v.name}): " + "; ".join(problems))


def measure_method(
    workers: list, pids: list[int], v: Variant, total: int, method: str, repeats: int
) -> list[Run]:
    """One warm-up and ``repeats`` timed transfers of one method, each verified."""
    if method in ("ours", "ours_a2a"):
        transfer = partial(ours_transfer, workers, collective=method == "ours_a2a")
        expected = expected_ours(v, total)
    else:
        transfer = partial(central_transfer, workers, copy_parts=method == "central")
        expected = expected_central(total)
    zero_copy = method == "central_zc"
    set_zero_copy(zero_copy)
    ray.get([w.zero_copy.remote(zero_copy) for w in workers], timeout=TIMEOUT_S)
    gc.collect()  # once per method: a full collection takes ~0.2 s with Ray and torch loaded
    runs = []
    try:
        for attempt in range(repeats + 1):
            release_free_memory()
            run = timed_run(transfer, pids)
            verify(workers, v, expected, method)
            if attempt > 0:  # the first run is the warm-up
                runs.append(run)
    finally:
        set_zero_copy(False)
        ray.get([w.zero_copy.remote(False) for w in workers], timeout=TIMEOUT_S)
    return runs


def time_memcpy(v: Variant, total: int, repeats: int) -> list[float]:
    """Seconds to copy every tensor of the full batch into fresh tensors, one thread."""
    batch = make_samples(v, torch.arange(total, dtype=torch.int64))
    tensors = [batch.get(k) for k in tensor_keys(batch)]
    seconds = []
    for attempt in range(repeats + 1):
        started = time.perf_counter()
        copies = [torch.empty_like(x).copy_(x) for x in tensors]
        elapsed = time.perf_counter() - started
        for x, y in zip(tensors, copies):
            if not torch.equal(x, y):
                raise RuntimeError("memcpy produced a different tensor")
        del copies
        if attempt > 0:
            seconds.append(elapsed)
    return seconds


# ----------------------------------------------------------------------------- the run
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_workers() -> tuple[list, list[int]]:
    """The 4 actors in one gloo world, and their process ids."""
    workers = [BenchWorker.remote(rank) for rank in range(WORLD)]
    port = free_port()
    ray.get([w.setup.remote(port) for w in workers], timeout=TIMEOUT_S)
    return workers, ray.get([w.pid.remote() for w in workers], timeout=TIMEOUT_S)


def summarize(runs: list[Run], payload: int) -> dict:
    """Median time and GB/s, worst memory over the repeats."""
    seconds = statistics.median(r.seconds for r in runs)
    return {
        "seconds": seconds,
        "seconds_all": [r.seconds for r in runs],
        "gb_per_s": payload / seconds / GB,
        "driver_increase_mb": max(r.driver_increase_mb for r in runs),
        "worker_peak_mb": max(r.worker_peak_mb for r in runs),
        "worker_increase_mb": max(r.worker_increase_mb for r in runs),
    }


def measure_ray_methods(variants: list[Variant], repeats: int) -> dict[tuple[str, int], dict]:
    """The Ray methods for every variant and scale, on one set of actors."""
    results: dict[tuple[str, int], dict] = {}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        workers, pids = start_workers()
        for v in variants:
            for scale in SCALES:
                total = v.base * scale
                payload = total * row_bytes(v)
                ray.get([w.build.remote(v, total) for w in workers], timeout=TIMEOUT_S)
                entry = {"samples": total, "payload_bytes": payload}
                for method in METHODS:
                    runs = measure_method(workers, pids, v, total, method, repeats)
                    entry[method] = summarize(runs, payload)
                results[(v.name, scale)] = entry
                speeds = ", ".join(f"{m} {entry[m]['gb_per_s']:.2f}" for m in METHODS)
                mib = payload / common.MB
                print(f"{v.name} {scale}x ({mib:.0f} MiB) GB/s: {speeds}", flush=True)
    finally:
        ray.shutdown()
    return results


def add_memcpy(results: dict[tuple[str, int], dict], variants: list[Variant], repeats: int) -> None:
    """The memcpy limit for every entry, measured in this process after Ray is gone."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for v in variants:
            for scale in SCALES:
                entry = results[(v.name, scale)]
                seconds = time_memcpy(v, entry["samples"], repeats)
                median = statistics.median(seconds)
                entry["memcpy"] = {
                    "seconds": median,
                    "seconds_all": seconds,
                    "gb_per_s": entry["payload_bytes"] / median / GB,
                }
                gc.collect()
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- the report
LABELS = {
    "ours": "ours",
    "ours_a2a": "ours-a2a",
    "central": "central",
    "central_zc": "central-zc",
    "memcpy": "memcpy",
}
COLUMNS = [
    "variant", "batch", "samples", "MiB",
    *(f"{LABELS[m]} GB/s" for m in (*METHODS, "memcpy")),
    "ours/central", "ours/central-zc", "ours/memcpy",
    *(f"driver +MiB {LABELS[m]}" for m in MEMORY_METHODS),
    *(f"worker peak MiB {LABELS[m]}" for m in MEMORY_METHODS),
    ">=2x central", ">=2x central-zc", ">=memcpy/3", "driver flat",
]  # fmt: skip


def met(ok: bool) -> str:
    return "yes" if ok else "NO"


def table_row(name: str, scale: int, entry: dict) -> dict:
    """One table row: throughputs, ratios, memory, and whether each target is met."""
    speed = {m: entry[m]["gb_per_s"] for m in (*METHODS, "memcpy")}
    ours = speed["ours"]
    row = {
        "variant": name,
        "batch": f"{scale}x",
        "samples": entry["samples"],
        "MiB": entry["payload_bytes"] / common.MB,
        **{f"{LABELS[m]} GB/s": value for m, value in speed.items()},
        "ours/central": ours / speed["central"],
        "ours/central-zc": ours / speed["central_zc"],
        "ours/memcpy": ours / speed["memcpy"],
    }
    for m in MEMORY_METHODS:
        row[f"driver +MiB {LABELS[m]}"] = entry[m]["driver_increase_mb"]
        row[f"worker peak MiB {LABELS[m]}"] = entry[m]["worker_peak_mb"]
    row[">=2x central"] = met(ours >= 2 * speed["central"])
    row[">=2x central-zc"] = met(ours >= 2 * speed["central_zc"])
    row[">=memcpy/3"] = met(ours >= speed["memcpy"] / 3)
    row["driver flat"] = met(entry["ours"]["driver_increase_mb"] <= FLAT_MB)
    return row


def plot(results: dict[tuple[str, int], dict], variants: list[Variant], out_dir: Path) -> None:
    """Per variant (one row each): GB/s of every method and the driver's RSS increase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(variants), 2, figsize=(10, 3.8 * len(variants)), squeeze=False)
    styles = {"ours": "o-", "ours_a2a": "o:", "central": "s--", "central_zc": "D-.", "memcpy": "^:"}
    for (speed, memory), v in zip(axes, variants):
        entries = [results[(v.name, s)] for s in SCALES]
        mib = [e["payload_bytes"] / common.MB for e in entries]
        for method, style in styles.items():
            values = [e[method]["gb_per_s"] for e in entries]
            speed.plot(mib, values, style, label=LABELS[method])
        target = [e["memcpy"]["gb_per_s"] / 3 for e in entries]
        speed.plot(mib, target, color="gray", lw=0.8, label="target: memcpy/3")
        for method in MEMORY_METHODS:
            increase = [e[method]["driver_increase_mb"] for e in entries]
            memory.plot(mib, increase, styles[method], label=LABELS[method])
        memory.plot(mib, mib, "k:", lw=0.8, label="batch size")
        speed.set(title=f"{v.name}: throughput", ylabel="GB/s (log)", yscale="log")
        memory.set(title=f"{v.name}: driver RSS increase", ylabel="MiB")
        labels = [f"{s}x\n{m:.3g} MiB" for s, m in zip(SCALES, mib)]
        for ax in (speed, memory):
            ax.set_xscale("log", base=2)
            ax.set_xticks(mib, labels)
            ax.minorticks_off()
            ax.set_xlabel("batch")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    common.save_figure(fig, "databuffer", out_dir)


def variants_for(quick: bool) -> list[Variant]:
    """Batch shapes: full sizes move about 300 MiB at 8x (1x: 1024 text samples, 38 MiB; 16
    trajectories, 37 MiB); quick ones 5-12 MiB."""
    if quick:
        return [Variant("text", 64, 8, 128, 384), Variant("image", 16, 4, 8, 64)]
    return [Variant("text", 1024, 8, 512, 1536), Variant("image", 16, 4, 16, 224)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per point (3)")
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR, help="output directory")
    args = parser.parse_args()
    variants = variants_for(args.quick)
    repeats = args.repeats or (2 if args.quick else 3)
    if repeats < 1:
        parser.error("--repeats must be at least 1")
    started = time.perf_counter()
    results = measure_ray_methods(variants, repeats)
    add_memcpy(results, variants, repeats)
    rows = [table_row(v.name, s, results[(v.name, s)]) for v in variants for s in SCALES]
    table = common.print_table(rows, COLUMNS)
    payload = {
        "description": __doc__.split("\n\n")[0],
        "quick": args.quick,
        "repeats": repeats,
        "src_layout": {"ranks": SRC.ranks, "tp": SRC.tp_size},
        "dst_layout": {"ranks": DST.ranks, "tp": DST.tp_size},
        "driver_flat_mib": FLAT_MB,
        "variants": [asdict(v) for v in variants],
        "rows": rows,
        "results": [
            {"variant": name, "scale": scale, **entry} for (name, scale), entry in results.items()
        ],
        "table": table,
        "wall_seconds": time.perf_counter() - started,
    }
    common.write_results("databuffer", payload, args.out)
    plot(results, variants, args.out)


if __name__ == "__main__":
    main()
