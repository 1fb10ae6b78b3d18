"""The distributed databuffer on real Ray actors talking over gloo.

Four actors (global ranks 0-3) share one gloo world for the whole module; every case creates
its process group on all of them in the same order, as DAG workers do. Each actor builds its
source shard from its rank, calls ``redistribute`` and returns a compact summary (sample ids,
a digest of each sample's content, token load). The test rebuilds every source shard locally
and checks that each sample arrived exactly once, intact, where the balanced assignment says.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from dataclasses import asdict, dataclass, replace
from datetime import timedelta

import pytest
import ray
import torch
import torch.distributed as dist
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.data.balance import assign_units, bin_loads
from embodied_rl.data.batch import make_batch, non_tensor_keys, strings, tensor_keys
from embodied_rl.data.databuffer import TransferStats, redistribute, token_weights
from embodied_rl.data.layout import Layout
from embodied_rl.data.transport import (
    AllToAllTransport,
    Transport,
    build_transport,
    transport_for,
)
from embodied_rl.shm import shm_dir

pytestmark = [pytest.mark.ray, pytest.mark.own_ray_cluster]  # its own ray.init (actors)

WORLD = 4
PROMPT_LEN = 4
RESPONSE_LEN = 6
TIMEOUT_S = 60


@dataclass(frozen=True)
class Case:
    """One redistribution scenario, shipped to every actor."""

    src: Layout
    dst: Layout
    counts: tuple[int, ...]  # samples per source dp shard; 0 -> an empty shard with no keys
    group_size: int = 0  # > 0 adds GROUP_ID = one id per group_size consecutive sample ids
    var_len: bool = False  # variable prompt/response lengths (token weights differ)
    keep_groups: bool = True
    bad_shape_dp: int = -1  # this source shard pads RESPONSE_IDS to a longer length
    poison_tp: bool = False  # non-leader source tp members hold different (wrong) data
    collective: bool = False  # force the all_to_all transport (default: shared memory here)
    nodes: tuple[str, ...] = ()  # the node each global rank claims to run on (default: real)


def prompt_len(sid: int, case: Case) -> int:
    return 1 + sid % PROMPT_LEN if case.var_len else PROMPT_LEN


def response_len(sid: int, case: Case) -> int:
    return (sid * 5) % (RESPONSE_LEN + 1) if case.var_len else RESPONSE_LEN


def sample_weight(sid: int, case: Case) -> int:
    """Real tokens of sample ``sid``, computed from its construction, not from its masks."""
    return prompt_len(sid, case) + response_len(sid, case)


def make_samples(sids: list[int], case: Case) -> TensorDict:
    """A batch whose every field is a deterministic function of the sample id."""
    ids = torch.tensor(sids, dtype=torch.int64)
    n = len(sids)
    p_pos, r_pos = torch.arange(PROMPT_LEN), torch.arange(RESPONSE_LEN)
    p_len = torch.tensor([prompt_len(s, case) for s in sids], dtype=torch.int64).reshape(n, 1)
    r_len = torch.tensor([response_len(s, case) for s in sids], dtype=torch.int64).reshape(n, 1)
    fields = {
        K.SAMPLE_ID: ids,
        K.PROMPT_IDS: ids[:, None] * 10 + p_pos,
        K.PROMPT_MASK: (p_pos >= PROMPT_LEN - p_len).to(torch.int64),  # left-padded
        K.RESPONSE_IDS: ids[:, None] * 100 + r_pos,
        K.RESPONSE_MASK: (r_pos < r_len).to(torch.float32),
        K.OLD_LOGPROBS: torch.sin(ids[:, None].double() + r_pos).float(),
        K.OBS_IMAGE: ((ids[:, None] * 7 + torch.arange(18)) % 256)
        .to(torch.uint8)
        .reshape(n, 2, 3, 3),
        K.SUCCESS: ids % 3 == 0,
        K.PROMPT_TEXT: [f"prompt {s} " + "é" * (s % 4) for s in sids],
        K.ANSWER_TEXT: ["" if s % 5 == 0 else str(s * s) for s in sids],
    }
    if case.group_size:
        # Ids not increasing with first appearance (0, 7, 3, 10, 6, ...): units must be
        # numbered by appearance, not by id value. Unique for up to 11 groups.
        fields[K.GROUP_ID] = 100 + (7 * (ids // case.group_size)) % 11
    return make_batch(fields, batch_size=n)


def shard_ids(case: Case, dp: int) -> list[int]:
    start = sum(case.counts[:dp])
    return list(range(start, start + case.counts[dp]))


def make_shard(case: Case, dp: int) -> TensorDict:
    if case.counts[dp] == 0:
        return TensorDict({}, batch_size=[0])  # an empty shard does not know the schema
    batch = make_samples(shard_ids(case, dp), case)
    if dp == case.bad_shape_dp:  # this shard padded its responses to its own longest length
        batch[K.RESPONSE_IDS] = torch.nn.functional.pad(batch[K.RESPONSE_IDS], (0, 2))
    return batch


def digest(batch: TensorDict, i: int) -> str:
    """Content hash of row ``i``: every key, dtype, shape and value."""
    h = hashlib.sha256()
    for key in tensor_keys(batch):
        row = batch.get(key)[i]
        h.update(f"{key}|{row.dtype}|{tuple(row.shape)}|".encode())
        h.update(row.contiguous().numpy().tobytes())
    for key in non_tensor_keys(batch):
        h.update(f"{key}|{strings(batch, key)[i]!r}|".encode())
    return h.hexdigest()[:16]


def summarize(out: TensorDict, batch: TensorDict | None) -> dict:
    n = int(out.batch_size[0])
    return {
        "ids": out.get(K.SAMPLE_ID).tolist() if K.SAMPLE_ID in out.keys() else [],
        "digests": [digest(out, i) for i in range(n)],
        "group_ids": out.get(K.GROUP_ID).tolist() if K.GROUP_ID in out.keys() else [],
        "tokens": float(token_weights(out).sum()),
        "schema": {
            k: (str(out.get(k).dtype), tuple(out.get(k).shape[1:])) for k in tensor_keys(out)
        },
        "object_keys": non_tensor_keys(out),
        "same_object": out is batch,
    }


@ray.remote(num_cpus=0.1)
class RankActor:
    """One worker of the gloo world; mirrors what a DAG worker does around ``redistribute``."""

    def __init__(self, rank: int) -> None:
        torch.set_num_threads(1)
        self.rank = rank
        self.groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        self.transports: dict[tuple, Transport] = {}

    def pid(self) -> int:
        return os.getpid()

    def setup(self, port: int) -> None:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=self.rank,
            world_size=WORLD,
            timeout=timedelta(seconds=TIMEOUT_S),  # a hang becomes an error, not a stuck test
        )

    def run(self, case: Case) -> dict | None:
        union = tuple(sorted(set(case.src.ranks) | set(case.dst.ranks)))
        group = None
        if case.src != case.dst:
            # new_group is collective over the whole world: every actor calls it, in case order.
            if union not in self.groups:
                self.groups[union] = dist.new_group(list(union))
            group = self.groups[union]
        if self.rank not in union:
            return None
        batch = make_shard(case, case.src.dp_rank(self.rank)) if self.rank in case.src else None
        if case.poison_tp and self.rank in case.src and case.src.tp_rank(self.rank) > 0:
            batch = make_samples([900 + self.rank], case)  # would show up if non-leaders sent
        stats = TransferStats()
        transport = None
        if case.collective and group is not None:
            transport = AllToAllTransport(group)
        elif case.nodes and group is not None:
            key = (union, case.nodes)  # one transport per group and node map, as in a run
            if key not in self.transports:
                self.transports[key] = build_transport(group, node=case.nodes[self.rank])
            transport = self.transports[key]
        try:
            out = redistribute(
                batch,
                case.src,
                case.dst,
                self.rank,
                group,
                keep_groups=case.keep_groups,
                transport=transport,
                stats=stats,
            )
        except ValueError as err:
            return {"error": str(err)}
        used = type(transport or transport_for(group)).__name__ if group is not None else None
        if out is None:
            return {"out": None, "stats": asdict(stats), "transport": used}
        return {"out": summarize(out, batch), "stats": asdict(stats), "transport": used}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def actors():
    # The actor class and helpers live in this test module, which Ray workers cannot import.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        group = [RankActor.remote(r) for r in range(WORLD)]
        port = _free_port()
        ray.get([a.setup.remote(port) for a in group], timeout=TIMEOUT_S)
        yield group
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def run_case(actors, case: Case) -> list[dict | None]:
    return ray.get([a.run.remote(case) for a in actors], timeout=TIMEOUT_S)


def reference_assignment(case: Case) -> tuple[dict[int, int], list[float]]:
    """Destination dp rank of every sample id, from an independent unit/weight computation.

    Returns:
        (sample id -> destination dp rank, weight per unit in unit order).
    """
    sids = [s for d in range(case.src.dp_size) for s in shard_ids(case, d)]
    unit_index: dict[object, int] = {}
    weights: list[float] = []
    unit_of_sample = []
    for sid in sids:  # source dp order, then position: the order units are numbered in
        grouped = case.group_size and case.keep_groups
        key = ("group", sid // case.group_size) if grouped else ("sample", sid)
        if key not in unit_index:
            unit_index[key] = len(weights)
            weights.append(0.0)
        weights[unit_index[key]] += sample_weight(sid, case)
        unit_of_sample.append(unit_index[key])
    bins = assign_units(weights, case.dst.dp_size)
    return {sid: bins[u] for sid, u in zip(sids, unit_of_sample)}, weights


def expected_digests(case: Case) -> dict[int, str]:
    out = {}
    for dp in range(case.src.dp_size):
        shard = make_shard(case, dp)
        out.update({sid: digest(shard, i) for i, sid in enumerate(shard_ids(case, dp))})
    return out


def check_case(actors, case: Case) -> tuple[list[dict], list[dict | None]]:
    """Run ``case`` and check the invariants every redistribution must keep.

    Returns:
        (summary per destination dp rank, raw result per global rank).
    """
    results = run_case(actors, case)
    union = set(case.src.ranks) | set(case.dst.ranks)
    for rank, result in enumerate(results):
        if rank not in union:
            assert result is None
        else:
            assert "error" not in result, result
            assert (result["out"] is None) == (rank not in case.dst)
    dest, _ = reference_assignment(case)
    digests = expected_digests(case)
    reference = make_samples([0], case)
    shards = []
    for d in range(case.dst.dp_size):
        members = [results[r]["out"] for r in case.dst.shard_ranks(d)]
        for other in members[1:]:
            assert other == members[0]  # every tp member holds the identical shard
        out = members[0]
        # Exactly the samples the balanced assignment gives this shard, in source order.
        assert out["ids"] == [sid for sid in sorted(dest) if dest[sid] == d]
        assert out["digests"] == [digests[sid] for sid in out["ids"]]
        assert out["schema"] == summarize(reference, None)["schema"]
        assert out["object_keys"] == non_tensor_keys(reference)
        assert not out["same_object"]
        shards.append(out)
    received = [sid for out in shards for sid in out["ids"]]
    assert sorted(received) == sorted(dest)  # every sample once, none lost or duplicated
    stats = [r["stats"] for r in results if r is not None]
    assert sum(s["bytes_sent"] for s in stats) == sum(s["bytes_received"] for s in stats)
    assert all(s["bytes_shm"] + s["bytes_network"] == s["bytes_sent"] for s in stats)
    # 2 for metadata; the payload is 1 all_to_all, or 2 barriers around shared-memory copies
    # (and 1 all_to_all between them when the ranks span nodes).
    spans_nodes = len(set(case.nodes)) > 1
    payload = 1 if case.collective else 3 if spans_nodes else 2
    if spans_nodes and len(set(case.nodes)) == len(case.nodes):
        payload = 1  # no two ranks share a node: the plain collective transport
    assert all(s["num_collectives"] == 2 + payload for s in stats)
    return shards, results


L2 = Layout((0, 1))
L3 = Layout((0, 1, 2))
L4 = Layout((0, 1, 2, 3))


def test_two_to_four(actors) -> None:
    shards, results = check_case(actors, Case(L2, L4, counts=(5, 6)))
    assert [len(s["ids"]) for s in shards] == [3, 3, 3, 2]
    # Ranks 2 and 3 only receive; ranks 0 and 1 keep part of their rows locally.
    assert results[2]["stats"]["bytes_sent"] == 0 and results[2]["stats"]["bytes_received"] > 0
    assert results[0]["stats"]["bytes_local"] > 0


def test_shared_memory_and_collective_transports_deliver_the_same_shards(actors) -> None:
    case = Case(L3, L4, counts=(5, 7, 4), group_size=4, var_len=True)
    shm_shards, shm_results = check_case(actors, case)
    all_to_all_shards, a2a_results = check_case(actors, replace(case, collective=True))
    assert shm_shards == all_to_all_shards
    # All four actors run on this machine, so the default transport is shared memory.
    assert {r["transport"] for r in shm_results} == {"SharedMemoryTransport"}
    assert {r["transport"] for r in a2a_results} == {"AllToAllTransport"}
    # Segments are reused across calls: at most one file per (sender, receiver) pair, even
    # after every earlier case in this module.
    pids = ray.get([a.pid.remote() for a in actors], timeout=TIMEOUT_S)
    files = [p for p in shm_dir().glob("erl-db-*") if int(p.name.split("-")[2]) in pids]
    pairs = {(p.name.split("-")[2], p.name.split("-")[-1]) for p in files}
    assert 0 < len(files) == len(pairs) <= WORLD * (WORLD - 1)


def test_ranks_on_two_nodes_use_shared_memory_within_and_the_collective_between(actors) -> None:
    """Ranks 0, 1 on node a send to ranks 0-3, of which 2, 3 are on node b: what 2 and 3
    receive is exactly what crossed nodes, what 1 receives went through shared memory."""
    case = Case(L2, L4, counts=(5, 6), nodes=("a", "a", "b", "b"))
    shards, results = check_case(actors, case)
    one_node_shards, _ = check_case(actors, replace(case, nodes=()))
    assert shards == one_node_shards
    assert {r["transport"] for r in results} == {"SharedMemoryTransport"}
    received = [r["stats"]["bytes_received"] for r in results]
    assert sum(r["stats"]["bytes_network"] for r in results) == received[2] + received[3] > 0
    assert sum(r["stats"]["bytes_shm"] for r in results) == received[0] + received[1] > 0


def test_interleaved_nodes_deliver_the_same_shards(actors) -> None:
    case = Case(L4, L3, counts=(3, 4, 2, 5), group_size=2, var_len=True, nodes=("a", "b") * 2)
    shards, results = check_case(actors, case)
    assert shards == check_case(actors, replace(case, nodes=()))[0]
    assert sum(r["stats"]["bytes_shm"] for r in results) > 0
    assert sum(r["stats"]["bytes_network"] for r in results) > 0


def test_ranks_each_on_its_own_node_use_the_collective_transport(actors) -> None:
    case = Case(L2, L4, counts=(5, 6), nodes=("a", "b", "c", "d"))
    shards, results = check_case(actors, case)
    assert {r["transport"] for r in results} == {"AllToAllTransport"}
    assert all(r["stats"]["bytes_shm"] == 0 for r in results)
    assert sum(r["stats"]["bytes_network"] for r in results) > 0


def test_four_to_two(actors) -> None:
    shards, results = check_case(actors, Case(L4, L2, counts=(3, 4, 2, 5)))
    assert [len(s["ids"]) for s in shards] == [7, 7]
    assert results[3]["out"] is None and results[3]["stats"]["bytes_received"] == 0


def test_three_to_two_uneven_variable_lengths(actors) -> None:
    case = Case(L3, L2, counts=(4, 3, 5), var_len=True)
    shards, results = check_case(actors, case)
    assert results[3] is None  # rank 3 is in neither layout
    _, weights = reference_assignment(case)
    loads = [s["tokens"] for s in shards]
    assert sum(loads) == sum(weights)
    assert max(loads) <= sum(weights) / 2 + max(weights)


def test_equal_layouts_pass_the_object_through(actors) -> None:
    results = run_case(actors, Case(L4, L4, counts=(2, 2, 2, 2)))
    for result in results:
        assert result["out"]["same_object"]
        assert result["stats"]["num_collectives"] == 0 and result["stats"]["bytes_sent"] == 0


def test_disjoint_ranks(actors) -> None:
    shards, results = check_case(actors, Case(L2, Layout((2, 3)), counts=(4, 3)))
    assert [len(s["ids"]) for s in shards] == [4, 3]
    for rank in (0, 1):
        assert results[rank]["out"] is None
        assert (
            results[rank]["stats"]["bytes_local"] == 0 and results[rank]["stats"]["bytes_sent"] > 0
        )


def test_destination_tensor_parallel_members_get_identical_shards(actors) -> None:
    shards, results = check_case(actors, Case(L2, Layout((0, 1, 2, 3), tp_size=2), counts=(5, 4)))
    assert [len(s["ids"]) for s in shards] == [5, 4]
    assert results[0]["out"] == results[1]["out"] and results[2]["out"] == results[3]["out"]


def test_only_source_shard_leaders_send(actors) -> None:
    # Non-leader tp members (ranks 1 and 3) hold a wrong sample; it must not appear anywhere.
    case = Case(Layout((0, 1, 2, 3), tp_size=2), L4, counts=(6, 5), poison_tp=True)
    shards, results = check_case(actors, case)
    assert results[1]["stats"]["bytes_sent"] == 0 and results[3]["stats"]["bytes_sent"] == 0


def test_more_shards_than_units_gives_empty_shards_with_full_schema(actors) -> None:
    # Two samples over four shards: two shards get one sample (one-row string fields), two
    # get none; check_case also checks the empty ones carry every key and trailing shape.
    shards, _ = check_case(actors, Case(L2, L4, counts=(1, 1)))
    assert [s["ids"] for s in shards] == [[0], [1], [], []]


def test_variable_lengths_are_balanced_by_tokens(actors) -> None:
    case = Case(L2, L4, counts=(13, 11), var_len=True)
    shards, _ = check_case(actors, case)
    dest, weights = reference_assignment(case)
    loads = [s["tokens"] for s in shards]
    assert loads == bin_loads(weights, [dest[sid] for sid in sorted(dest)], 4)
    assert max(loads) <= sum(weights) / 4 + max(weights)
    # A plain split of the sample sequence (6 samples per shard) is worse on this data.
    plain = [sum(weights[6 * d : 6 * d + 6]) for d in range(4)]
    assert max(loads) < max(plain)


def _groups_per_shard(shards: list[dict]) -> dict[int, set[int]]:
    shard_of_group: dict[int, set[int]] = {}
    for d, out in enumerate(shards):
        for gid in out["group_ids"]:
            shard_of_group.setdefault(gid, set()).add(d)
    return shard_of_group


@pytest.mark.parametrize("var_len", [True, False])
def test_keep_groups_keeps_split_groups_whole(actors, var_len: bool) -> None:
    # Groups of 4 ids; counts (5, 7, 4) split groups {4..7} and {12..15} across source shards.
    # With equal lengths every group weighs the same, so ties are broken by unit order: the
    # reference check in check_case then pins units to first-appearance order.
    case = Case(L3, L4, counts=(5, 7, 4), group_size=4, var_len=var_len)
    shards, _ = check_case(actors, case)
    shard_of_group = _groups_per_shard(shards)
    assert len(shard_of_group) == 4
    assert all(len(dsts) == 1 for dsts in shard_of_group.values())
    assert all(len(s["group_ids"]) == 4 for s in shards)  # 4 groups of 4 on 4 shards
    _, weights = reference_assignment(case)
    assert max(s["tokens"] for s in shards) <= sum(weights) / 4 + max(weights)


def test_keep_groups_false_balances_samples(actors) -> None:
    case = Case(L3, L4, counts=(5, 7, 4), group_size=4, keep_groups=False)
    shards, _ = check_case(actors, case)
    # Equal weights: samples go round-robin, so every group of 4 spreads over 4 shards.
    assert all(len(dsts) == 4 for dsts in _groups_per_shard(shards).values())


def test_empty_source_shard(actors) -> None:
    # Source shard 0 has no rows and no keys; its schema is taken from the others.
    shards, results = check_case(actors, Case(L3, Layout((1, 2, 3)), counts=(0, 5, 4)))
    assert sum(len(s["ids"]) for s in shards) == 9
    assert results[0]["out"] is None and results[0]["stats"]["bytes_sent"] == 0


def test_all_source_shards_empty(actors) -> None:
    results = run_case(actors, Case(L2, L3, counts=(0, 0)))
    for rank in range(3):
        out = results[rank]["out"]
        assert out["ids"] == [] and out["schema"] == {} and out["object_keys"] == []


def test_mismatched_trailing_shape_raises_on_every_rank(actors) -> None:
    bad = Case(L2, L3, counts=(3, 3), bad_shape_dp=1)
    results = run_case(actors, bad)
    for rank in range(3):
        message = results[rank]["error"]
        assert "'response_ids'" in message and "[6]" in message and "[8]" in message
        assert "max_prompt_length" in message
    # Every rank failed at the same point, so the group is still usable.
    check_case(actors, Case(L2, L3, counts=(3, 3)))
