"""Tests of the sharded prompt loader: sharding, order, epochs, resume, formats, bad rows."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from embodied_rl import keys as K
from embodied_rl.data.batch import strings
from embodied_rl.data.dataloader import ShardedPromptLoader, index_jsonl
from embodied_rl.data.layout import Layout
from embodied_rl.nodes.data import (
    PromptDataConfig,
    next_loader_batch,
    setup_loader,
    token_counter,
)
from embodied_rl.registry import load_plugins
from embodied_rl.runtime.context import MetricSink, NodeContext
from embodied_rl.runtime.models import ModelStore

ANSWERS = ("prompt", "answer")


def _rows(n: int) -> list[dict]:
    return [{"prompt": f"prompt {i}", "answer": f"answer {i}"} for i in range(n)]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write_parquet(path: Path, rows: list[dict], row_group_size: int = 3) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def _loader(path: Path, **overrides) -> ShardedPromptLoader:
    kwargs = {"global_batch_size": 4, "dp_rank": 0, "dp_size": 1, "seed": 7}
    kwargs.update(overrides)
    return ShardedPromptLoader(path, **kwargs)


def _expected_rows(n: int, seed: int, epoch: int, step: int, b: int) -> list[int]:
    """The documented order, computed independently of the loader."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    return perm[step * b : (step + 1) * b].tolist()


@pytest.mark.parametrize("dp_size", [1, 2, 4])
def test_union_of_ranks_is_the_global_batch_without_overlap(tmp_path: Path, dp_size: int) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", _rows(24))
    loaders = [
        _loader(path, global_batch_size=8, dp_rank=d, dp_size=dp_size, required_fields=ANSWERS)
        for d in range(dp_size)
    ]
    for step in range(3):
        batches = [loader.next_batch() for loader in loaders]
        rows = torch.cat([b[K.ROW_INDEX] for b in batches]).tolist()
        assert rows == _expected_rows(24, 7, 0, step, 8)
        assert len(set(rows)) == 8
        # unique over the run: step k's ids are k*B .. k*B+B-1
        assert torch.cat([b[K.SAMPLE_ID] for b in batches]).tolist() == list(
            range(8 * step, 8 * step + 8)
        )
        for batch in batches:
            assert len(batch) == 8 // dp_size
            row_ids = batch[K.ROW_INDEX].tolist()
            assert strings(batch, K.PROMPT_TEXT) == [f"prompt {r}" for r in row_ids]
            assert strings(batch, K.ANSWER_TEXT) == [f"answer {r}" for r in row_ids]


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_a_rank_parses_only_its_rows(tmp_path: Path, suffix: str) -> None:
    rows = _rows(40)
    path = tmp_path / f"p.{suffix}"
    _write_jsonl(path, rows) if suffix == "jsonl" else _write_parquet(path, rows)
    # With an exchange, the start-up row check is shared: each rank checks 40 / 4 rows.
    loaders = _build_on_ranks(4, path, global_batch_size=8)
    assert [loader.rows_checked for loader in loaders] == [10, 10, 10, 10]
    for loader in loaders:
        assert loader.rows_parsed == 0
        for _ in range(3):
            before = loader.rows_parsed
            loader.next_batch()
            assert loader.rows_parsed - before == 2
    alone = _loader(path, global_batch_size=8, dp_rank=3, dp_size=4)  # no exchange: all rows
    assert alone.rows_checked == 40 and alone.rows_parsed == 0


def test_shuffle_differs_per_epoch_and_is_deterministic_per_seed(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", _rows(12))

    def two_epochs(**kw) -> list[list[int]]:
        loader = _loader(path, **kw)
        epochs = []
        for _ in range(2):
            epochs.append(torch.cat([loader.next_batch()[K.ROW_INDEX] for _ in range(3)]).tolist())
        return epochs

    first, second = two_epochs(), two_epochs()
    assert first == second
    assert sorted(first[0]) == sorted(first[1]) == list(range(12))
    assert first[0] != first[1]
    assert two_epochs(seed=8)[0] != first[0]
    assert two_epochs(shuffle=False) == [list(range(12)), list(range(12))]


def test_epoch_rollover_skips_the_partial_batch(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", _rows(10))
    loader = _loader(path)
    assert loader.steps_per_epoch == 2
    seen = [loader.next_batch()[K.ROW_INDEX].tolist() for _ in range(3)]
    assert seen[0] == _expected_rows(10, 7, 0, 0, 4)
    assert seen[1] == _expected_rows(10, 7, 0, 1, 4)
    assert seen[2] == _expected_rows(10, 7, 1, 0, 4)
    assert (loader.epoch, loader.step_in_epoch) == (1, 1)


def test_without_drop_last_the_last_batch_is_filled_from_the_epoch_start(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", _rows(10))
    loader = _loader(path, drop_last=False, shuffle=False)
    assert loader.steps_per_epoch == 3
    seen = [loader.next_batch()[K.ROW_INDEX].tolist() for _ in range(4)]
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [0, 1, 2, 3]]


def test_resume_gives_the_batches_of_an_uninterrupted_run(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", _rows(10))
    reference = _loader(path, global_batch_size=4, dp_size=1)
    expected = [reference.next_batch()[K.ROW_INDEX].tolist() for _ in range(7)]

    interrupted = _loader(path, dp_size=1)
    for _ in range(3):
        interrupted.next_batch()
    state = json.loads(json.dumps(interrupted.state_dict()))  # plain values only
    # A resumed run may use another data-parallel size: the state holds global positions.
    resumed = [_loader(path, seed=123, dp_rank=d, dp_size=2) for d in range(2)]
    for loader in resumed:
        loader.load_state_dict(state)
    for want in expected[3:]:
        got = torch.cat([loader.next_batch()[K.ROW_INDEX] for loader in resumed]).tolist()
        assert got == want


def test_resume_refuses_another_file_or_batch_size(tmp_path: Path) -> None:
    state = _loader(_write_jsonl(tmp_path / "a.jsonl", _rows(10))).state_dict()
    other = _loader(_write_jsonl(tmp_path / "b.jsonl", _rows(11)))
    with pytest.raises(ValueError, match="10 rows.*11 rows.*same data file"):
        other.load_state_dict(state)
    same_file_other_batch = _loader(tmp_path / "a.jsonl", global_batch_size=2)
    with pytest.raises(ValueError, match="global_batch_size=4"):
        same_file_other_batch.load_state_dict(state)


def test_parquet_and_jsonl_give_identical_batches(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i}", "answer": i * 3} for i in range(14)]
    jsonl = _write_jsonl(tmp_path / "p.jsonl", rows)
    parquet = _write_parquet(tmp_path / "p.parquet", rows, row_group_size=4)
    for rank in range(2):
        a = _loader(jsonl, global_batch_size=6, dp_rank=rank, dp_size=2, required_fields=ANSWERS)
        b = _loader(parquet, global_batch_size=6, dp_rank=rank, dp_size=2, required_fields=ANSWERS)
        for _ in range(5):  # crosses an epoch boundary
            x, y = a.next_batch(), b.next_batch()
            assert torch.equal(x[K.ROW_INDEX], y[K.ROW_INDEX])
            assert torch.equal(x[K.SAMPLE_ID], y[K.SAMPLE_ID])
            assert strings(x, K.PROMPT_TEXT) == strings(y, K.PROMPT_TEXT)
            # Numeric answers become strings, the same way in both formats.
            assert strings(x, K.ANSWER_TEXT) == strings(y, K.ANSWER_TEXT)
            assert strings(x, K.ANSWER_TEXT) == [str(r * 3) for r in x[K.ROW_INDEX].tolist()]


def _file_with_bad_line(tmp_path: Path, bad_line: str) -> Path:
    lines = ['{"prompt": "a"}', "", '{"prompt": "b"}', "   ", bad_line, '{"prompt": "c"}']
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ('{"prompt": "x"', "is not valid JSON"),
        ('{"question": "x"}', "lacks the required field 'prompt'"),
        ('{"prompt": null}', "lacks the required field 'prompt'"),
        ('{"prompt": ["x"]}', "has a prompt of type list, expected a string"),
        ("[1, 2]", "is not a JSON object"),
    ],
)
def test_a_malformed_row_or_missing_field_refuses_the_file_naming_its_line(
    tmp_path: Path, bad_line: str, problem: str
) -> None:
    path = _file_with_bad_line(tmp_path, bad_line)
    with pytest.raises(ValueError) as info:
        _loader(path, global_batch_size=2, shuffle=False)
    assert str(info.value).startswith(f"{path}: line 5 {problem}")
    assert str(info.value).endswith(
        "(1 such row(s) in the file). Fix or remove those rows, or set on_bad_row='drop' to "
        "skip them (they are counted as data/dropped_malformed and data/dropped_missing_field)"
    )


def test_drop_mode_drops_and_counts_malformed_rows_and_missing_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = ['{"prompt": "a"}', '{"prompt": "b"', '{"q": 1}', '{"prompt": "c"}', '{"q": 2}']
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level("WARNING", logger="embodied_rl.data.dataloader"):
        loader = _loader(path, global_batch_size=2, shuffle=False, on_bad_row="drop")
    assert loader.dropped == {"malformed": 1, "missing_field": 2}
    assert (loader.num_rows, loader.num_usable, loader.steps_per_epoch) == (5, 2, 1)
    assert strings(loader.next_batch(), K.PROMPT_TEXT) == ["a", "c"]
    (record,) = caplog.records
    assert record.getMessage().startswith(
        f"{path}: dropped rows (2 of 5; dropped 1 malformed, 2 missing_field). malformed: first "
        "at line 2, which is not valid JSON"
    )
    assert "missing_field: first at line 3, which lacks the required field 'prompt'" in (
        record.getMessage()
    )


def test_empty_prompts_are_dropped_and_counted_and_batches_stay_full(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prompts = ["p0", "", "p2", "  \t", "p4", "p5", "\n", "p7", "p8", "p9"]
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": p} for p in prompts])
    with caplog.at_level("WARNING", logger="embodied_rl.data.dataloader"):
        loaders = [
            _loader(path, global_batch_size=2, dp_rank=d, dp_size=2, shuffle=False)
            for d in range(2)
        ]
    # Only rank 0 warns, once; both ranks agree on the usable rows.
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: dropped rows (7 of 10; dropped 3 empty). empty: first at line 2, which has "
        "an empty prompt"
    ]
    for loader in loaders:
        assert loader.dropped == {"empty": 3} and loader.num_usable == 7
        assert loader.steps_per_epoch == 3  # 7 usable rows, batches of 2, partial one dropped
        assert loader.state_dict()["dropped"] == {"empty": 3}
    seen = [[strings(loader.next_batch(), K.PROMPT_TEXT) for loader in loaders] for _ in range(4)]
    assert seen == [[["p0"], ["p2"]], [["p4"], ["p5"]], [["p7"], ["p8"]], [["p0"], ["p2"]]]


def test_every_row_dropped_is_a_clear_error(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": " "}, {"prompt": ""}])
    with pytest.raises(
        ValueError, match=r"p\.jsonl has no usable rows \(0 of 2; dropped 2 empty\)"
    ):
        _loader(path, global_batch_size=1)


def _word_count(prompts: list[str]) -> list[int]:
    """A whitespace tokenizer: one token per word."""
    return [len(p.split()) for p in prompts]


def test_prompts_over_the_token_limit_are_dropped_and_counted(tmp_path: Path) -> None:
    prompts = ["one", "one two three", "one two three four", "", "a b", "a b c d e"]
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": p} for p in prompts])
    loader = _loader(
        path, global_batch_size=3, shuffle=False, max_prompt_tokens=3, count_tokens=_word_count
    )
    assert loader.dropped == {"empty": 1, "too_long": 2}
    assert strings(loader.next_batch(), K.PROMPT_TEXT) == ["one", "one two three", "a b"]
    assert loader.next_batch()[K.ROW_INDEX].tolist() == [0, 1, 4]  # next epoch, same rows
    with pytest.raises(ValueError, match="max_prompt_tokens and count_tokens go together"):
        _loader(path, max_prompt_tokens=3)


def test_the_length_check_counts_tokens_in_chunks(tmp_path: Path) -> None:
    calls = []

    def counting(prompts: list[str]) -> list[int]:
        calls.append(len(prompts))
        return _word_count(prompts)

    rows = [{"prompt": "w " * (i % 5 + 1)} for i in range(2500)]
    path = _write_jsonl(tmp_path / "p.jsonl", rows)
    loader = _loader(path, max_prompt_tokens=4, count_tokens=counting)
    assert calls == [1024, 1024, 452]
    assert loader.dropped == {"too_long": 500} and loader.num_usable == 2000


def test_required_fields_and_layout_errors_say_what_to_change(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", _rows(8))
    with pytest.raises(ValueError, match="not a positive multiple of dp_size=4"):
        _loader(path, global_batch_size=6, dp_size=4)
    with pytest.raises(ValueError, match="fewer than global_batch_size=16"):
        _loader(path, global_batch_size=16)
    with pytest.raises(ValueError, match="lacks the required field 'source'"):
        _loader(path, required_fields=("prompt", "source"))
    parquet = _write_parquet(tmp_path / "p.parquet", _rows(8))
    with pytest.raises(ValueError, match=r"no column\(s\) \['source'\]"):
        _loader(parquet, required_fields=("source",))


def test_index_handles_chunk_boundaries_crlf_and_no_final_newline(tmp_path: Path) -> None:
    text = b'{"prompt": "first"}\r\n\n  \n{"prompt": "a longer second row"}\n{"prompt": "last"}'
    path = tmp_path / "p.jsonl"
    path.write_bytes(text)
    for chunk in (1, 7, 1 << 20):
        starts, lengths, lines = index_jsonl(path, chunk_bytes=chunk)
        rows = [json.loads(text[s : s + n]) for s, n in zip(starts, lengths)]
        assert [r["prompt"] for r in rows] == ["first", "a longer second row", "last"]
        assert list(lines) == [1, 4, 5]


def test_parquet_bad_rows_name_the_row(tmp_path: Path) -> None:
    rows = [{"prompt": "a"}, {"prompt": "b"}, {"prompt": None}, {"prompt": "d"}, {"prompt": ""}]
    path = _write_parquet(tmp_path / "p.parquet", rows, row_group_size=2)
    with pytest.raises(ValueError, match=r"p\.parquet: row 2 \(0-based\) lacks the required field"):
        _loader(path, global_batch_size=2, shuffle=False)
    loader = _loader(path, global_batch_size=2, shuffle=False, on_bad_row="drop")
    assert loader.dropped == {"missing_field": 1, "empty": 1}
    assert strings(loader.next_batch(), K.PROMPT_TEXT) == ["a", "b"]
    assert strings(loader.next_batch(), K.PROMPT_TEXT) == ["a", "b"]  # 3 usable: next epoch


def test_required_answers_are_checked_in_every_row(tmp_path: Path) -> None:
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b"}, {"prompt": "c", "answer": 3}]
    path = _write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(ValueError, match=r"p\.jsonl: line 2 lacks the required field 'answer'"):
        _loader(path, global_batch_size=1, required_fields=ANSWERS)
    loader = _loader(
        path, global_batch_size=2, shuffle=False, required_fields=ANSWERS, on_bad_row="drop"
    )
    assert strings(loader.next_batch(), K.ANSWER_TEXT) == ["1", "3"]  # numbers become strings
    no_answers = _loader(path, global_batch_size=3)
    assert K.ANSWER_TEXT not in no_answers.next_batch().keys()


def test_resume_refuses_other_row_checks(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a b " * i} for i in range(1, 9)])
    state = _loader(path, global_batch_size=2, max_prompt_tokens=8, count_tokens=_word_count)
    stricter = _loader(path, global_batch_size=2, max_prompt_tokens=4, count_tokens=_word_count)
    with pytest.raises(ValueError, match="saved when 4 rows of p.jsonl were usable, now 2 are"):
        stricter.load_state_dict(state.state_dict())


def _build_on_ranks(dp_size: int, path: Path, **kwargs) -> list[ShardedPromptLoader]:
    """Build one loader per rank at once, each in a thread, sharing its row check.

    The exchange is a real all-gather between the threads (a barrier and shared slots),
    standing in for torch.distributed across worker processes. A loader that raises is
    returned as its exception.
    """
    slots: list = [None] * dp_size
    barrier = threading.Barrier(dp_size)

    def exchange(obj):
        slots[obj[0]] = obj
        barrier.wait(timeout=30)
        gathered = list(slots)
        barrier.wait(timeout=30)
        return gathered

    def build(rank: int):
        try:
            return _loader(path, dp_rank=rank, dp_size=dp_size, exchange=exchange, **kwargs)
        except ValueError as err:
            return err

    with ThreadPoolExecutor(dp_size) as pool:
        return list(pool.map(build, range(dp_size)))


def test_shared_row_check_gives_every_rank_the_result_of_a_full_check(tmp_path: Path) -> None:
    prompts = [f"w{i} " * (i % 7) for i in range(50)]  # every 7th prompt is empty
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": p} for p in prompts])
    kwargs = {"global_batch_size": 4, "max_prompt_tokens": 5, "count_tokens": _word_count}
    alone = _loader(path, **kwargs)
    loaders = _build_on_ranks(4, path, **kwargs)
    assert [x.rows_checked for x in loaders] == [12, 13, 12, 13]
    assert alone.dropped == {"empty": 8, "too_long": 7}
    for loader in loaders:
        assert loader.dropped == alone.dropped
        assert loader.permutation(0).tolist() == alone.permutation(0).tolist()
    for _ in range(9):  # 35 usable rows: 8 steps per epoch; crosses into epoch 1
        together = torch.cat([x.next_batch()[K.ROW_INDEX] for x in loaders]).tolist()
        assert together == alone.next_batch()[K.ROW_INDEX].tolist()


def test_a_refused_row_fails_every_rank_with_the_same_error(tmp_path: Path) -> None:
    rows = [json.dumps({"prompt": f"p{i}"}) for i in range(20)]
    rows[13] = '{"prompt": 13'
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(rows) + "\n")
    errors = _build_on_ranks(4, path, global_batch_size=4)
    assert all(isinstance(e, ValueError) for e in errors)  # the ranks that saw no bad row too
    assert len({str(e) for e in errors}) == 1
    assert str(errors[0]).startswith(f"{path}: line 14 is not valid JSON")


def test_the_prompt_node_drops_prompts_the_rollout_would_refuse(tmp_path: Path) -> None:
    """data.prompts with the actor's real tokenizer: over-long and empty prompts are dropped,
    counted in metrics, and every prompt it keeps fits the LLM rollout's max_prompt_length."""
    load_plugins(["policies", "rollout"])
    from rollout.llm import left_pad_prompts

    models = ModelStore({"actor": {"policy": "causal_lm"}}, torch.device("cpu"))
    tokenizer = models["actor"].tokenizer
    prompts = ["1+1=", "   ", "12+34-56*78/90=" * 3, "9-3=", "7*8=", "40+2="]
    limit = 8
    assert [len(ids) > limit for ids in tokenizer(prompts)["input_ids"]] == [0, 0, 1, 0, 0, 0]
    path = _write_jsonl(tmp_path / "p.jsonl", [{"prompt": p, "answer": "1"} for p in prompts])
    config = PromptDataConfig(
        path=str(path),
        batch_size=2,
        shuffle=False,
        max_prompt_length=limit,
        tokenizer_model="actor",
    )
    ctx = NodeContext(
        cfg=OmegaConf.create({"seed": 0}), node_id="prompts", node_config=config, rank=0,
        world_size=1, layout=Layout((0,)), dp_group=None, models=models, state={}, step=0,
        metrics=MetricSink(), device=torch.device("cpu"), run_dir=tmp_path,
    )  # fmt: skip
    setup_loader(ctx)
    kept = [strings(next_loader_batch(ctx, None), K.PROMPT_TEXT) for _ in range(2)]
    assert kept == [["1+1=", "9-3="], ["7*8=", "40+2="]]
    metrics = ctx.metrics.pop()
    assert metrics["data/dropped_empty"] == (1.0, 2.0, "max")  # logged at both steps
    assert metrics["data/dropped_too_long"] == (1.0, 2.0, "max")
    assert "data/dropped_malformed" not in metrics
    ids, mask = left_pad_prompts(tokenizer(kept[0] + kept[1])["input_ids"], range(4), limit, 0)
    assert ids.shape == (4, limit) and mask.sum(dim=1).min() >= 1
    with pytest.raises(ValueError, match=f"more than max_prompt_length={limit}"):
        left_pad_prompts(tokenizer([prompts[2]])["input_ids"], [0], limit, 0)


def test_token_counts_are_exact_over_the_limit_and_bounds_below_it() -> None:
    load_plugins(["policies"])
    tokenizer = ModelStore({"a": {"policy": "causal_lm"}}, torch.device("cpu"))["a"].tokenizer
    prompts = ["1+1=", "你好世界，今天天气很好", "🙂" * 6, "a" * 40, "héllo wörld " * 3, " 7"]
    exact = [len(ids) for ids in tokenizer(prompts)["input_ids"]]
    for limit in (2, 6, 12, 64):
        counts = token_counter(tokenizer, limit)(prompts)
        assert all(c >= e for c, e in zip(counts, exact)), (limit, counts, exact)
        assert [c > limit for c in counts] == [e > limit for e in exact]
        assert [c for c, e in zip(counts, exact) if e > limit] == [e for e in exact if e > limit]
