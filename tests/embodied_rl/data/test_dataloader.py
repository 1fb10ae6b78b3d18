"""Tests of the sharded prompt loader: sharding, order, epochs, resume, formats, bad rows."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.data.batch import strings
from embodied_rl.data.dataloader import ShardedPromptLoader, index_jsonl


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
        _loader(path, global_batch_size=8, dp_rank=d, dp_size=dp_size) for d in range(4)[:dp_size]
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
    loader = _loader(path, global_batch_size=8, dp_rank=3, dp_size=4)
    # Indexing parses nothing; a JSONL file is probed once for an answer field.
    assert loader.rows_parsed == (1 if suffix == "jsonl" else 0)
    for _ in range(3):
        before = loader.rows_parsed
        loader.next_batch()
        assert loader.rows_parsed - before == 2


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
        a = _loader(jsonl, global_batch_size=6, dp_rank=rank, dp_size=2)
        b = _loader(parquet, global_batch_size=6, dp_rank=rank, dp_size=2)
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
        ('{"prompt": "x"', "not valid JSON"),
        ('{"question": "x"}', "lacks the required field 'prompt'"),
        ('{"prompt": "  "}', "empty prompt"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_bad_rows_raise_with_the_line_number(tmp_path: Path, bad_line: str, problem: str) -> None:
    path = _file_with_bad_line(tmp_path, bad_line)
    loader = _loader(path, global_batch_size=4, shuffle=False)
    assert loader.num_rows == 4  # blank lines are not rows
    with pytest.raises(ValueError, match=rf"bad\.jsonl: line 5 .*{problem}.*on_bad_row='drop'"):
        loader.next_batch()
    assert (loader.epoch, loader.step_in_epoch) == (0, 0)  # an error does not advance


def test_drop_mode_removes_and_counts_bad_rows(tmp_path: Path) -> None:
    path = _file_with_bad_line(tmp_path, '{"prompt": ""}')
    loader = _loader(
        path, global_batch_size=2, dp_rank=1, dp_size=2, shuffle=False, on_bad_row="drop"
    )
    first = loader.next_batch()  # rows [0, 1]; this rank has row 1 ("b")
    assert strings(first, K.PROMPT_TEXT) == ["b"]
    second = loader.next_batch()  # rows [2, 3]; this rank has row 3 ("c")
    assert strings(second, K.PROMPT_TEXT) == ["c"]
    assert loader.dropped_rows == 0
    rank0 = _loader(path, global_batch_size=2, dp_size=2, shuffle=False, on_bad_row="drop")
    rank0.next_batch()
    dropped = rank0.next_batch()  # this rank's row 2 is the bad line 5
    assert len(dropped) == 0 and rank0.dropped_rows == 1
    assert rank0.state_dict()["dropped_rows"] == 1


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
    rows = [{"prompt": "a"}, {"prompt": "b"}, {"prompt": None}, {"prompt": "d"}]
    path = _write_parquet(tmp_path / "p.parquet", rows)
    loader = _loader(path, global_batch_size=4, shuffle=False)
    with pytest.raises(ValueError, match=r"p\.parquet: row 2 \(0-based\) lacks the required field"):
        loader.next_batch()


def test_answers_become_required_when_the_first_row_has_one(tmp_path: Path) -> None:
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b"}, {"prompt": "c", "answer": "3"}]
    path = _write_jsonl(tmp_path / "p.jsonl", rows)
    loader = _loader(path, global_batch_size=1, shuffle=False, on_bad_row="drop")
    batches = [loader.next_batch() for _ in range(3)]
    assert [len(b) for b in batches] == [1, 0, 1] and loader.dropped_rows == 1
    assert strings(batches[2], K.ANSWER_TEXT) == ["3"]
    no_answers = _write_jsonl(tmp_path / "q.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    assert K.ANSWER_TEXT not in _loader(no_answers, global_batch_size=2).next_batch().keys()
