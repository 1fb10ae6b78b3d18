"""OpenVLA action tokens: the released convention by hand, round trips, id arithmetic."""

from __future__ import annotations

import pytest
import torch

from policies.openvla.action_tokenizer import ActionTokenizer
from policies.openvla.configuration import TINY_ARCHITECTURE


def test_real_vocabulary_arithmetic() -> None:
    tok = ActionTokenizer(32000, 32064)
    assert tok.first_id == 31744
    assert tok.logit_slice == slice(-320, -64)
    logits = torch.arange(32064)
    assert torch.equal(logits[tok.logit_slice], torch.arange(31744, 32000))


def test_tiny_and_unpadded_vocabulary_arithmetic() -> None:
    tiny = ActionTokenizer(TINY_ARCHITECTURE.vocab_size, TINY_ARCHITECTURE.padded_vocab_size)
    assert (tiny.vocab_size, tiny.padded_vocab_size, tiny.first_id) == (151936, 152000, 151680)
    assert tiny.first_id >= 151646  # clear of every Qwen2.5 tokenizer id
    odd = ActionTokenizer(1000, 1040)
    assert odd.logit_slice == slice(-296, -40)
    assert torch.equal(torch.arange(1040)[odd.logit_slice], torch.arange(744, 1000))
    unpadded = ActionTokenizer(1000)
    assert unpadded.logit_slice == slice(-256, None)
    assert torch.equal(torch.arange(1000)[unpadded.logit_slice], torch.arange(744, 1000))


def test_encode_decode_by_hand() -> None:
    tok = ActionTokenizer(32000, 32064)
    # edges = -1 + 2 i / 255; token = 32000 - digitize(x, edges).
    x = torch.tensor([-1.0, 1.0, 0.0, 0.5, -3.0, 7.0])
    tokens = tok.encode(x)
    # -1 -> d=1; 1 -> d=256; 0 in [e127, e128) -> d=128; 0.5 in [e191=0.49804, e192) -> 192.
    assert tokens.tolist() == [31999, 31744, 31872, 31808, 31999, 31744]
    values = tok.decode(tokens)
    e = lambda i: -1.0 + 2.0 * i / 255.0  # noqa: E731
    expected = [(e(0) + e(1)) / 2, (e(254) + e(255)) / 2, 0.0, (e(191) + e(192)) / 2]
    assert values[:4].tolist() == pytest.approx(expected, abs=1e-7)
    assert values[4] == values[0] and values[5] == values[1]  # clipped to [-1, 1]
    # Larger actions map to smaller ids (the released checkpoints' convention).
    assert bool((tok.encode(torch.linspace(-1, 1, 50)).diff() <= 0).all())


def test_round_trip_error_at_most_half_a_bin() -> None:
    tok = ActionTokenizer(32000, 32064)
    x = torch.rand(2000, dtype=torch.float64) * 2 - 1
    tokens = tok.encode(x)
    assert int(tokens.min()) >= tok.first_id and int(tokens.max()) < tok.vocab_size
    assert float((tok.decode(tokens).double() - x).abs().max()) <= 1 / 255 + 1e-6


def test_index_token_mapping() -> None:
    tok = ActionTokenizer(1000, 1040)
    index = torch.tensor([0, 17, 255])
    assert tok.index_to_token(index).tolist() == [744, 761, 999]
    assert torch.equal(tok.token_to_index(tok.index_to_token(index)), index)
    with pytest.raises(ValueError, match="not action tokens"):
        tok.token_to_index(torch.tensor([743, 800]))
