"""Causal-LM policy: any ``transformers`` causal LM behind the policy interface.

Rollout calls :meth:`CausalLMPolicy.generate`; the trainer calls
:meth:`CausalLMPolicy.evaluate` for log-probabilities and entropies of the sampled tokens.
Both see the same distribution: ``softmax(logits / temperature)``, optionally restricted
to a small token set (constrained decoding, see ``logits.py``).

Shapes: ``B`` samples, ``P`` prompt tokens (left-padded), ``R`` response tokens
(right-padded), ``V`` vocabulary entries (``K`` of them when restricted).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.checks import check_range
from embodied_rl.registry import POLICIES
from policies.causal_lm.configuration import CausalLMConfig
from policies.causal_lm.tokenizer import build_qwen2_tokenizer, load_tokenizer

# transformers is imported where a model is built or generates (about 5 s): importing
# ``policies``, which every worker process and CLI call does, must not pay for it.
if TYPE_CHECKING:
    from transformers import (
        LogitsProcessorList,
        PreTrainedModel,
        PreTrainedTokenizerBase,
        Qwen2ForCausalLM,
    )


class CausalLMPolicy(torch.nn.Module):
    """A causal LM with its tokenizer, generating and scoring responses to prompts.

    Attributes:
        model: the ``transformers`` causal LM.
        tokenizer: its tokenizer (pad token set; shared, treat as read-only).
        eos_ids: (E,) int64 token ids that end a response.
        allowed_ids: (K,) int64 sorted token ids the policy may emit (allowed strings plus
            EOS), or ``None`` for the whole vocabulary.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        allowed_response_tokens: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "the tokenizer has no pad token; load it with policies.causal_lm.load_tokenizer "
                "(which uses eos as pad) or set tokenizer.pad_token"
            )
        self.pad_token_id = int(tokenizer.pad_token_id)
        eos = _eos_token_ids(model, tokenizer)
        self.register_buffer("eos_ids", torch.tensor(eos, dtype=torch.long), persistent=False)
        allowed = None
        if allowed_response_tokens is not None:
            ids = single_token_ids(tokenizer, allowed_response_tokens)
            allowed = torch.tensor(sorted(set(ids) | set(eos)), dtype=torch.long)
        self.register_buffer("allowed_ids", allowed, persistent=False)
        # The policy defines the sampling distribution itself. A checkpoint's
        # generation_config may carry top_k/repetition_penalty/... defaults that generate()
        # would apply silently, making rollout sample from a distribution evaluate() does not
        # score; replace it with one that only names the special tokens.
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig(
            eos_token_id=eos, pad_token_id=self.pad_token_id, bos_token_id=tokenizer.bos_token_id
        )
        # Computing logits only for the response positions saves a (B, P, V) tensor.
        self._has_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def response_mask(self, response_ids: torch.Tensor) -> torch.Tensor:
        """1.0 for tokens up to and including the first EOS, 0.0 after it.

        Args:
            response_ids: (B, R) int64.

        Returns:
            (B, R) float32.
        """
        is_eos = torch.isin(response_ids, self.eos_ids.to(response_ids.device)).long()
        eos_before = (is_eos.cumsum(dim=1) - is_eos) > 0
        return (~eos_before).float()

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        do_sample: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample one response per prompt with HF ``generate`` (eval mode, no grad).

        Sampling uses the global torch RNG; seed it for reproducible results.

        Args:
            prompt_ids: (B, P) int64, left-padded.
            prompt_mask: (B, P) int, 1 = real token.
            max_new_tokens: R, the response length.
            temperature: softmax temperature (> 0) when sampling.
            top_p: nucleus mass in (0, 1]; 1 disables it.
            do_sample: sample (True) or decode greedily (False).

        Returns:
            response_ids: (B, R) int64, right-padded with the pad id.
            response_mask: (B, R) float32, 1 up to and including the first EOS.
        """
        _check_sampling(max_new_tokens, temperature, top_p)
        batch, prompt_len = prompt_ids.shape
        device = self.device
        if batch == 0:
            empty = torch.empty(0, max_new_tokens, dtype=torch.long, device=device)
            return empty, empty.float()
        was_training = self.model.training
        self.model.eval()
        try:
            output = self.model.generate(
                input_ids=prompt_ids.to(device),
                attention_mask=prompt_mask.to(device).long(),
                logits_processor=self._logits_processors(temperature, top_p, do_sample),
                max_new_tokens=max_new_tokens,
                **_hf_sampling_flags(do_sample),
            )
        finally:
            self.model.train(was_training)
        response = output[:, prompt_len:]
        # generate() stops early once every row has finished: pad back to exactly R.
        response = F.pad(response, (0, max_new_tokens - response.shape[1]), value=self.pad_token_id)
        return response, self.response_mask(response)

    def _logits_processors(
        self, temperature: float, top_p: float, do_sample: bool
    ) -> LogitsProcessorList:
        from policies.causal_lm.logits import logits_processors

        return logits_processors(self.allowed_ids, temperature, top_p, do_sample)

    def evaluate(
        self, batch: TensorDict, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability and entropy of each response token under the current weights.

        One forward pass over prompt + response. Prompts are left-padded, so positions are
        counted over real tokens only (as ``generate`` does); response tokens after EOS are
        attended to like in ``generate`` but their outputs are zeroed. Differentiable.

        Args:
            batch: with PROMPT_IDS (B, P), PROMPT_MASK (B, P), RESPONSE_IDS (B, R) and
                RESPONSE_MASK (B, R).
            temperature: the logits are divided by it (use the rollout temperature).

        Returns:
            logprobs: (B, R) float32 ``log pi(token)``, 0 where RESPONSE_MASK is 0.
            entropy: (B, R) float32 entropy of the token distribution, 0 where masked.
        """
        check_range("evaluate temperature", temperature, 0, low_open=True)
        device = self.device
        prompt_ids = batch[K.PROMPT_IDS].to(device)
        prompt_mask = batch[K.PROMPT_MASK].to(device)
        response_ids = batch[K.RESPONSE_IDS].to(device)
        valid = batch[K.RESPONSE_MASK].to(device) > 0
        if self.allowed_ids is not None and self._plain_lm_head:
            # Only the allowed tokens' logits: the same numbers as the full head's columns
            # (then -inf elsewhere), without the (B, R, V) tensor: V is 151646 for Qwen2, 11
            # allowed tokens for the digit tasks, and long multi-turn responses made that
            # tensor most of a training step's time and memory.
            logits = self._allowed_response_logits(prompt_ids, prompt_mask, response_ids)
        else:
            logits = self._response_logits(prompt_ids, prompt_mask, response_ids)
            if self.allowed_ids is not None:
                # As -inf on the other logits before the softmax, without the -inf * 0 = nan
                # that would appear in the entropy.
                logits = logits.index_select(-1, self.allowed_ids)
        logits = logits / temperature
        targets = response_ids
        if self.allowed_ids is not None:
            targets = self._allowed_positions(response_ids, valid)
        logprobs_all = torch.log_softmax(logits, dim=-1)
        logprobs = logprobs_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(logprobs_all.exp() * logprobs_all).sum(dim=-1)
        zero = torch.zeros((), dtype=logprobs.dtype, device=device)
        return torch.where(valid, logprobs, zero), torch.where(valid, entropy, zero)

    def _response_logits(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor
    ) -> torch.Tensor:
        """Float32 logits (B, R, V) predicting each response token."""
        resp_len = response_ids.shape[1]
        extra = {"logits_to_keep": resp_len + 1} if self._has_logits_to_keep else {}
        output = self.model(
            **response_forward_inputs(prompt_ids, prompt_mask, response_ids),
            use_cache=False,
            **extra,
        )
        # The logit at position t predicts token t + 1: the last prompt position predicts
        # the first response token; the last position predicts nothing.
        return output.logits[:, -(resp_len + 1) : -1].float()

    @property
    def _plain_lm_head(self) -> bool:
        """The model's logits are its backbone's last hidden states times the output
        embedding (plus its bias): no logit scaling or soft-capping after the head."""
        config = self.model.config
        scaled = any(
            getattr(config, name, None) not in (None, 1.0)
            for name in ("final_logit_softcapping", "logit_scale", "logits_scaling")
        )
        return not scaled and isinstance(self.model.get_output_embeddings(), torch.nn.Linear)

    def _allowed_response_logits(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor
    ) -> torch.Tensor:
        """Float32 logits (B, R, K) of the K allowed tokens predicting each response token."""
        resp_len = response_ids.shape[1]
        hidden = self.model.base_model(
            **response_forward_inputs(prompt_ids, prompt_mask, response_ids), use_cache=False
        ).last_hidden_state[:, -(resp_len + 1) : -1]
        head = self.model.get_output_embeddings()
        bias = None if head.bias is None else head.bias.index_select(0, self.allowed_ids)
        weight = head.weight.index_select(0, self.allowed_ids)
        return F.linear(hidden.to(weight.dtype), weight, bias).float()

    def _allowed_positions(self, response_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Index of each response token within ``allowed_ids`` (B, R); 0 where masked."""
        allowed = self.allowed_ids
        index = torch.searchsorted(allowed, response_ids).clamp(max=allowed.numel() - 1)
        inside = allowed[index] == response_ids
        if bool((valid & ~inside).any()):
            bad = sorted(set(response_ids[valid & ~inside].tolist()))
            raise ValueError(
                f"response token ids {bad[:10]} are outside allowed_response_tokens; the "
                "responses were not generated by this constrained policy"
            )
        return torch.where(inside, index, torch.zeros_like(index))

    # ------------------------------------------------------------ for inference engines
    @property
    def inference_dtype(self) -> str:
        """Parameter dtype name (``float32``, ``bfloat16``, ...) an engine should run in."""
        return str(next(self.model.parameters()).dtype).removeprefix("torch.")

    def save_pretrained(self, folder: str | os.PathLike[str]) -> Path:
        """Write the LM in the ``transformers`` layout (``config.json``,
        ``generation_config.json``, ``model.safetensors``) and its tokenizer's files.

        ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` load it,
        and so does this policy with ``preset: null, path: <folder>``.
        """
        out = Path(folder).expanduser()
        self.model.save_pretrained(str(out))  # safetensors (transformers' default)
        self.tokenizer.save_pretrained(str(out))
        return out

    def save_architecture(self, folder: str) -> None:
        """Write the model's ``config.json`` (architecture only, no weights) into ``folder``."""
        self.model.config.save_pretrained(folder)

    def inference_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights under their ``transformers`` checkpoint names, as full tensors.

        Sharded (FSDP2 DTensor) parameters are gathered one at a time, which is a collective:
        every rank holding a shard must iterate in the same order.
        """
        for name, tensor in self.model.state_dict().items():
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            yield name, tensor

    @classmethod
    def from_config(cls, config: CausalLMConfig, device: torch.device) -> CausalLMPolicy:
        """Build the tokenizer and the model (preset or local checkpoint) on ``device``."""
        model, tokenizer = build_model_and_tokenizer(config, device)
        policy = cls(model, tokenizer, config.allowed_response_tokens)
        return policy.to(device)


def response_forward_inputs(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Model inputs of one forward pass over left-padded prompts followed by responses.

    Every response position is attended to (tokens after EOS too, as in ``generate``).

    Args:
        prompt_ids: (B, P) int64, left-padded, P >= 1.
        prompt_mask: (B, P), 1 = real token.
        response_ids: (B, R) int64.

    Returns:
        ``input_ids``, ``attention_mask`` and ``position_ids``, each (B, P + R) int64.
    """
    if prompt_ids.shape[1] == 0:
        raise ValueError("scoring a response needs at least one prompt token per sample")
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention = torch.cat(
        [prompt_mask.long(), torch.ones_like(response_ids, dtype=torch.long)], dim=1
    )
    # Left padding shifts real tokens right; HF's generate numbers positions by
    # counting real tokens, and so must we (pads get position 0, they are masked).
    position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids}


def build_model_and_tokenizer(
    config: CausalLMConfig, device: torch.device
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The tokenizer and the causal LM (preset or local checkpoint) on ``device``."""
    tokenizer = _tokenizer_for(config)
    if config.preset is not None:
        model = build_tiny_qwen2(len(tokenizer), tokenizer, config.seed)
    else:
        model = _load_pretrained(config)
    _check_vocab(model, tokenizer)
    model.to(device=device, dtype=config.torch_dtype)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model, tokenizer


def build_tiny_qwen2(
    vocab_size: int, tokenizer: PreTrainedTokenizerBase, seed: int
) -> Qwen2ForCausalLM:
    """The ``tiny_qwen2`` preset: a 2-layer, 64-wide Qwen2 (2 heads of 32) with random init.

    The init is seeded (without touching the global RNG), so every rank that builds it
    with the same seed gets identical weights.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        # Head size 32: the smallest vLLM's attention kernels take (same weight shapes as
        # 4 heads of 16, so the seeded init is unchanged).
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.eval()


def _tokenizer_for(config: CausalLMConfig) -> PreTrainedTokenizerBase:
    if config.tokenizer_path is not None:
        return load_tokenizer(config.tokenizer_path, config.trust_remote_code)
    if config.path is not None:
        return load_tokenizer(config.path, config.trust_remote_code)
    return build_qwen2_tokenizer()


def _load_pretrained(config: CausalLMConfig) -> PreTrainedModel:
    folder = Path(config.path).expanduser()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"causal_lm path {folder} has no config.json; point path at a local HF checkpoint "
            "directory (config.json + *.safetensors); nothing is downloaded"
        )
    if not any(folder.glob("*.safetensors")):
        raise FileNotFoundError(
            f"causal_lm path {folder} has no *.safetensors weights; only safetensors are "
            "loaded (pickled pytorch_model.bin files can run code when unpickled): convert "
            "the checkpoint with save_pretrained, which writes safetensors"
        )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(folder),
        local_files_only=True,
        use_safetensors=True,
        trust_remote_code=config.trust_remote_code,
        dtype=config.torch_dtype,
    )
    return model.eval()


def _check_vocab(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    rows = model.get_output_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise ValueError(
            f"tokenizer has {len(tokenizer)} tokens but the model's output layer only {rows}; "
            "use the checkpoint's own tokenizer (unset tokenizer_path)"
        )


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's eos id plus any the checkpoint's generation config lists."""
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if configured is not None:
        ids.update([configured] if isinstance(configured, int) else configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("neither the tokenizer nor the model defines an eos token id")
    return sorted(ids)


def single_token_ids(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[str]) -> list[int]:
    """The id of each string in ``tokens``; each must be exactly one token."""
    ids = []
    for text in tokens:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(
                f"allowed_response_tokens entry {text!r} is {len(encoded)} tokens {encoded} "
                "for this tokenizer; every entry must be exactly one token (split it into "
                "single-token entries)"
            )
        ids.append(int(encoded[0]))
    return ids


def _hf_sampling_flags(do_sample: bool) -> dict[str, Any]:
    """Flags that switch HF's own warpers off: ours run in the order evaluate() assumes."""
    if not do_sample:
        return {"do_sample": False}
    # top_k must be named: HF's default is 50, which would cut the distribution silently.
    return {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}


def _check_sampling(max_new_tokens: int, temperature: float, top_p: float) -> None:
    check_range("max_new_tokens", max_new_tokens, 1)
    fix = "; use do_sample=False for greedy decoding"
    check_range("temperature", temperature, 0, low_open=True, fix=fix)
    check_range("top_p", top_p, 0, 1, low_open=True)


@POLICIES.register("causal_lm")
def build_causal_lm(options: Mapping[str, Any], device: torch.device) -> CausalLMPolicy:
    """Registry builder: ``options`` are :class:`CausalLMConfig` fields."""
    return CausalLMPolicy.from_config(CausalLMConfig.from_options(options), torch.device(device))
