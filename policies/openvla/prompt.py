"""OpenVLA prompts: the instruction template and its token ids, left-padded per batch.

The prompt is ``"In: What action should the robot take to {instruction.lower()}?\\nOut:"``.
OpenVLA appends the SentencePiece space token ``"▁"`` (id 29871 for Llama-2) when the prompt
does not already end with it, to match training. Prompts of a batch differ in length; they are
left-padded, so that in the VLA sequence (``policy_base.py``) the padding sits *inside the
prompt block* and the image tokens and the suffix (action tokens) keep the same index in
every row.

Tokenizers without a BOS token (the Qwen2.5 tokenizer the tiny preset uses for the prompt
text, as no Llama-2 tokenizer is available offline) start the sequence with their EOS token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # type only: importing ``policies`` must not import transformers
    from transformers import PreTrainedTokenizerBase

PROMPT = "In: What action should the robot take to {}?\nOut:"
SPACE_TOKEN = "▁"


class PromptEncoder:
    """Token ids of OpenVLA prompts, cached per instruction (instructions repeat all the time)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        bos = tokenizer.bos_token_id
        self.start_id = int(bos if bos is not None else tokenizer.eos_token_id)
        space = tokenizer.convert_tokens_to_ids(SPACE_TOKEN)
        known = isinstance(space, int) and space != tokenizer.unk_token_id
        self.space_id = space if known else None
        self.pad_id = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.start_id
        )
        self._cache: dict[str, list[int]] = {}

    def text_ids(self, instruction: str) -> list[int]:
        """Prompt ids after the start token, ending with the space token when there is one."""
        if instruction not in self._cache:
            prompt = PROMPT.format(instruction.lower())
            ids = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
            if self.space_id is not None and (not ids or ids[-1] != self.space_id):
                ids.append(self.space_id)
            self._cache[instruction] = ids
        return self._cache[instruction]

    def batch(self, instructions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids (N, T) int64 and their mask (N, T) int64."""
        rows = [self.text_ids(text) for text in instructions]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
        return ids, mask
