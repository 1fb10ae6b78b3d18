"""OpenVLA policy on the tiny preset: act/evaluate invariant, vision, prompts, loading."""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
import json
import warnings

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tensordict import TensorDict

import policies  # noqa: F401  (registers the policies)
from embodied_rl import keys as K
from embodied_rl.interfaces import EmbodiedPolicy
from embodied_rl.registry import POLICIES
from policies.normalization import Normalizer
from policies.openvla import OpenVLAPolicy, build_openvla, save_checkpoint
from policies.openvla.loading import from_published_name, load_weights, to_published_name
from policies.openvla.prismatic import PrismaticVLA, _cache_argument
from policies.openvla.prompt import PROMPT
from policies.openvla.vision import center_crop_resize, images_to_float
from tests.policies.bins import check_bin_logprobs

CPU = torch.device("cpu")
INSTRUCTIONS = ["Pick up the black bowl and place it on the plate", "open the drawer"]


@pytest.fixture(scope="module")
def policy() -> OpenVLAPolicy:
    return build_openvla({"seed": 0, "micro_batch_size": 2}, CPU)


def images(n: int, seed: int, size: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def trajectories(obs: np.ndarray, tokens: torch.Tensor, prompts: list[str]) -> TensorDict:
    """B=2 trajectories of T=3 steps: obs 0, 1 | 2, 3 at steps 0, 1; step 2 masked."""
    b, t = 2, 3
    image = torch.zeros(b, t, *obs.shape[1:], dtype=torch.uint8)
    stored = torch.zeros(b, t, tokens.shape[1], dtype=tokens.dtype)  # masked steps: junk 0s
    for i in range(4):
        image[i // 2, i % 2] = torch.from_numpy(obs[i])
        stored[i // 2, i % 2] = tokens[i]
    batch = TensorDict(
        {
            K.OBS_IMAGE: image,
            K.ACTION_TOKENS: stored,
            K.STEP_MASK: torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]),
        },
        batch_size=[b],
    )
    batch[K.PROMPT_TEXT] = prompts
    return batch


def test_registered_and_options_validated(policy: OpenVLAPolicy) -> None:
    assert POLICIES.get("openvla") is build_openvla
    assert isinstance(policy, EmbodiedPolicy) and policy.tokens_per_step == 7
    with pytest.raises(ValueError, match=r"openvla policy: unknown option\(s\) \['chunk'\]"):
        build_openvla({"chunk": 8}, CPU)
    with pytest.raises(ValueError, match="exactly one of preset"):
        build_openvla({"path": "/nowhere"}, CPU)
    with pytest.raises(ValueError, match="gripper_convention"):
        build_openvla({"gripper_convention": "franka"}, CPU)


def test_prompt_tokens(policy: OpenVLAPolicy) -> None:
    prompts = policy.prompts
    ids = prompts.text_ids("Open The Drawer")
    assert policy.tokenizer.decode(ids) == PROMPT.format("open the drawer")
    assert prompts.space_id is None  # Qwen2.5 has no SentencePiece "▁" token
    assert prompts.start_id == policy.tokenizer.eos_token_id  # ... and no BOS
    batch_ids, mask = prompts.batch(["open the drawer", INSTRUCTIONS[0]])
    short = len(prompts.text_ids("open the drawer"))
    assert mask[0].tolist() == [0] * (batch_ids.shape[1] - short) + [1] * short  # left-padded
    assert batch_ids[0, -short:].tolist() == prompts.text_ids("open the drawer")


def test_act_shapes_and_action_ids(policy: OpenVLAPolicy) -> None:
    torch.manual_seed(0)
    out = policy.act(images(3, 0), INSTRUCTIONS + [""], None, temperature=1.0, do_sample=True)
    tok = policy.vla.action_tokenizer
    assert out.actions.shape == (3, 1, 7) and out.actions.dtype == np.float32
    assert out.tokens.shape == (3, 7) and out.tokens.dtype == torch.int64
    assert int(out.tokens.min()) >= tok.first_id and int(out.tokens.max()) < tok.vocab_size
    assert out.logprobs.shape == (3, 7) and bool((out.logprobs < 0).all())
    # No statistics, no gripper convention: the actions are the bins' centres.
    assert np.allclose(out.actions[:, 0], tok.decode(out.tokens).numpy())
    greedy = [policy.act(images(3, 0), INSTRUCTIONS + [""], None, temperature=1.0, do_sample=False)]
    greedy.append(
        policy.act(images(3, 0), INSTRUCTIONS + [""], None, temperature=1.0, do_sample=False)
    )
    assert torch.equal(greedy[0].tokens, greedy[1].tokens)


def test_act_passes_the_kv_cache_under_the_current_argument_name(policy: OpenVLAPolicy) -> None:
    """Decoding with the KV cache raises no deprecation warning of the installed transformers
    (``past_key_values`` gave a FutureWarning in every worker's console)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy.act(images(2, 0), INSTRUCTIONS, None, temperature=1.0, do_sample=False)
    deprecations = (FutureWarning, DeprecationWarning)
    assert [str(w.message) for w in caught if issubclass(w.category, deprecations)] == []


def test_kv_cache_argument_of_older_transformers() -> None:
    """Before the rename the decoder takes and returns ``past_key_values``."""

    class OldDecoder:
        def forward(self, inputs_embeds=None, past_key_values=None, use_cache=None): ...

    assert _cache_argument(OldDecoder) == "past_key_values"
    assert PrismaticVLA.kv_cache({"last_hidden_state": 0, "past_key_values": "kv"}) == "kv"


def test_evaluate_reproduces_act_logprobs(policy: OpenVLAPolicy) -> None:
    obs = images(4, 1)
    prompts = [INSTRUCTIONS[0], INSTRUCTIONS[0], INSTRUCTIONS[1], INSTRUCTIONS[1]]
    torch.manual_seed(1)
    out = policy.act(obs, prompts, None, temperature=1.6, do_sample=True)
    logprobs, entropy = policy.evaluate(trajectories(obs, out.tokens, INSTRUCTIONS), 1.6)
    assert logprobs.shape == entropy.shape == (2, 21)
    steps = logprobs.reshape(2, 3, 7)
    assert torch.allclose(steps[:, :2].reshape(4, 7), out.logprobs, atol=1e-5)
    assert bool((steps[:, 2] == 0).all()) and bool((entropy.reshape(2, 3, 7)[:, 2] == 0).all())
    other = policy.evaluate(trajectories(obs, out.tokens, INSTRUCTIONS), 1.0)[0].reshape(2, 3, 7)
    assert not torch.allclose(other[:, :2], steps[:, :2], atol=1e-3)  # temperature matters


def test_bin_logprobs_are_teacher_forced_evaluate_before_the_gather(policy: OpenVLAPolicy) -> None:
    obs = images(4, 3)
    prompts = [INSTRUCTIONS[0], INSTRUCTIONS[0], INSTRUCTIONS[1], INSTRUCTIONS[1]]
    torch.manual_seed(3)
    out = policy.act(obs, prompts, None, temperature=1.0, do_sample=True)
    check_bin_logprobs(policy, trajectories(obs, out.tokens, INSTRUCTIONS), 256)


def test_entropy_and_logprobs_match_full_lm_logits(policy: OpenVLAPolicy) -> None:
    """Direct computation: the unpadded sequence through the whole LM, logits sliced."""
    obs, temperature = images(1, 2), 1.3
    tokens = policy.act(obs, [INSTRUCTIONS[1]], None, temperature=1.0, do_sample=True).tokens
    vla = policy.vla
    with torch.no_grad():
        ids = [policy.prompts.start_id]
        text = policy.prompts.text_ids(INSTRUCTIONS[1]) + tokens[0, :-1].tolist()
        image_tokens = vla.image_tokens(policy.pixel_values(obs))
        embeds = torch.cat(
            [
                vla.embed_tokens(torch.tensor([ids])),
                image_tokens,
                vla.embed_tokens(torch.tensor([text])),
            ],
            dim=1,
        )
        logits = vla.language_model(inputs_embeds=embeds).logits[0, -7:]
    action_logits = logits[:, vla.action_tokenizer.logit_slice] / temperature
    probs = torch.softmax(action_logits, dim=-1)
    entropy = -(probs * probs.log()).sum(-1)
    chosen = probs.log().gather(-1, (tokens[0] - vla.action_tokenizer.first_id)[:, None])[:, 0]
    batch = TensorDict(
        {
            K.OBS_IMAGE: torch.from_numpy(obs)[:, None],
            K.ACTION_TOKENS: tokens[:, None],
            K.STEP_MASK: torch.ones(1, 1),
        },
        batch_size=[1],
    )
    batch[K.PROMPT_TEXT] = [INSTRUCTIONS[1]]
    logp, ent = policy.evaluate(batch, temperature)
    assert torch.allclose(ent[0], entropy, atol=1e-5)
    assert torch.allclose(logp[0], chosen, atol=1e-5)
    assert float(entropy.max()) <= np.log(256) + 1e-6


def test_evaluate_is_differentiable(policy: OpenVLAPolicy) -> None:
    obs = images(4, 3)
    prompts = [INSTRUCTIONS[0]] * 2 + [INSTRUCTIONS[1]] * 2
    tokens = policy.act(obs, prompts, None, temperature=1.0, do_sample=True).tokens
    policy.zero_grad()
    logprobs, _ = policy.evaluate(trajectories(obs, tokens, INSTRUCTIONS), 1.0)
    logprobs.sum().backward()
    vla = policy.vla
    for param in (
        vla.language_model.model.layers[0].self_attn.q_proj.weight,
        vla.projector.fc1.weight,
        vla.vision_backbone.featurizer.blocks[0].attn.qkv.weight,
        vla.vision_backbone.fused_featurizer.patch_embed.proj.weight,
    ):
        assert param.grad is not None and float(param.grad.abs().sum()) > 0
    policy.zero_grad()


def test_policy_outputs_env_actions_with_statistics(policy: OpenVLAPolicy) -> None:
    stats = {"q01": [-2.0] * 6 + [0.0], "q99": [2.0] * 6 + [1.0], "mask": [True] * 6 + [False]}
    saved = policy.normalizer
    policy.normalizer = Normalizer(7, 0, "libero")
    policy.normalizer.set_statistics({"action": stats})
    try:
        out = policy.act(images(2, 4), INSTRUCTIONS, None, temperature=1.0, do_sample=True)
    finally:
        policy.normalizer = saved
    centres = policy.vla.action_tokenizer.decode(out.tokens).numpy()
    assert np.allclose(out.actions[:, 0, :6], 2.0 * centres[:, :6], atol=1e-6)
    assert np.array_equal(out.actions[:, 0, 6], -np.sign(2.0 * centres[:, 6] - 1.0))


def test_seed_gives_identical_weights(policy: OpenVLAPolicy) -> None:
    same = build_openvla({"seed": 0}, CPU).state_dict()
    other = build_openvla({"seed": 1}, CPU).state_dict()
    reference = policy.state_dict()
    assert all(torch.equal(reference[k], same[k]) for k in reference)
    assert not torch.equal(reference["vla.projector.fc1.weight"], other["vla.projector.fc1.weight"])


def test_backbone_reads_second_to_last_block(policy: OpenVLAPolicy) -> None:
    backbone = policy.vla.vision_backbone
    pixels = policy.pixel_values(images(2, 5))
    with torch.no_grad():
        before = backbone(pixels)
        assert before.shape == (2, backbone.num_patches, backbone.embed_dim) == (2, 16, 80)
        last = backbone.featurizer.blocks[-1].mlp.fc2.bias
        saved = last.clone()
        last.add_(1.0)
        unchanged = backbone(pixels)
        last.copy_(saved)
        middle = backbone.fused_featurizer.blocks[-2].mlp.fc2.bias
        middle.add_(1.0)
        changed = backbone(pixels)
        middle.sub_(1.0)
    assert torch.equal(before, unchanged)
    assert torch.equal(before[..., :32], changed[..., :32])  # DINOv2 part untouched
    assert not torch.allclose(before[..., 32:], changed[..., 32:])
    assert not backbone.featurizer.blocks[-1].mlp.fc2.weight.requires_grad
    assert not backbone.fused_featurizer.attn_pool.latent.requires_grad


def test_image_preprocessing_by_hand() -> None:
    ramp = torch.arange(10.0).expand(1, 1, 10, 10)  # value = column index
    crop = center_crop_resize(ramp, area=0.81)  # side 0.9: columns 0.45 + 0.9 j
    assert torch.allclose(crop[0, 0, 3], 0.45 + 0.9 * torch.arange(10.0), atol=1e-5)
    rows = center_crop_resize(ramp.transpose(2, 3), area=0.81)
    assert torch.allclose(rows[0, 0, :, 7], 0.45 + 0.9 * torch.arange(10.0), atol=1e-5)
    assert torch.allclose(center_crop_resize(ramp, area=1.0), ramp, atol=1e-5)
    pixels = torch.from_numpy(images(1, 6, size=32))
    assert torch.equal(images_to_float(pixels, 32), pixels.permute(0, 3, 1, 2).float() / 255.0)
    assert images_to_float(pixels, 16).shape == (1, 3, 16, 16)


def test_published_name_mapping() -> None:
    pairs = {
        "vla.vision_backbone.featurizer.blocks.3.ls1.gamma": (
            "vision_backbone.featurizer.blocks.3.ls1.scale_factor"
        ),
        "vla.vision_backbone.fused_featurizer.attn_pool.latent": (
            "vision_backbone.fused_featurizer.attn_pool.latent"
        ),
        "vla.projector.fc3.bias": "projector.fc3.bias",
        "vla.language_model.lm_head.weight": "language_model.lm_head.weight",
        "action_head.fc_in.weight": "action_head.fc_in.weight",
    }
    for ours, published in pairs.items():
        assert to_published_name(ours) == published
        assert from_published_name(published) == ours
    assert (
        from_published_name("language_model.model.layers.0.self_attn.rotary_emb.inv_freq") is None
    )


def test_checkpoint_round_trip(policy: OpenVLAPolicy, tmp_path) -> None:
    stats = {
        "libero_10_no_noops": {
            "action": {
                "q01": [-0.5] * 6 + [0.0],
                "q99": [0.5] * 6 + [1.0],
                "mask": [True] * 6 + [False],
            }
        }
    }
    folder = save_checkpoint(
        policy, tmp_path / "ckpt", policy.vla.arch, stats, policy.tokenizer, shard_size=40
    )
    names = set()
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            names.update(handle.keys())
    for published in (
        "vision_backbone.featurizer.blocks.0.ls1.scale_factor",
        "vision_backbone.featurizer.reg_token",
        "vision_backbone.fused_featurizer.attn_pool.kv.weight",
        "projector.fc1.weight",
        "language_model.model.embed_tokens.weight",
        "language_model.model.layers.1.mlp.gate_proj.weight",
        "language_model.lm_head.weight",
    ):
        assert published in names
    assert not any(n.startswith(("vla.", "normalizer.")) or n.endswith("gamma") for n in names)
    assert json.loads((folder / "dataset_statistics.json").read_text()) == stats
    assert (folder / "model.safetensors.index.json").is_file()

    loaded = build_openvla(
        {"preset": None, "path": str(folder), "gripper_convention": "libero"}, CPU
    )
    reference = policy.state_dict()
    weights = {k: v for k, v in loaded.state_dict().items() if not k.startswith("normalizer.")}
    assert len(weights) == len(reference) - 4 and all(
        torch.equal(reference[k], v) for k, v in weights.items()
    )
    # The statistics (not in the weight files) fill the normaliser's buffers.
    assert loaded.normalizer.statistics() == stats["libero_10_no_noops"]
    assert loaded.statistics_name == "libero_10_no_noops"
    frozen = loaded.vla.vision_backbone.fused_featurizer.blocks[-1].attn.qkv.weight
    assert not frozen.requires_grad and loaded.vla.projector.fc1.weight.requires_grad
    obs = images(2, 7)
    a = policy.act(obs, INSTRUCTIONS, None, temperature=1.0, do_sample=False)
    b = loaded.act(obs, INSTRUCTIONS, None, temperature=1.0, do_sample=False)
    assert torch.equal(a.tokens, b.tokens) and torch.allclose(a.logprobs, b.logprobs, atol=1e-6)
    centres = policy.vla.action_tokenizer.decode(a.tokens).numpy()
    assert np.allclose(b.actions[:, 0, :6], 0.5 * (centres[:, :6] + 1) - 0.5, atol=1e-6)
    assert np.array_equal(b.actions[:, 0, 6], -np.sign(2 * centres[:, 6] - 1))


def test_loading_errors(policy: OpenVLAPolicy, tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        build_openvla({"preset": None, "path": str(tmp_path)}, CPU)
    folder = save_checkpoint(policy, tmp_path / "ckpt", policy.vla.arch)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["projector.fc2.bias"]
    tensors["projector.fc4.bias"] = torch.zeros(3)
    save_file(tensors, str(folder / "model.safetensors"))
    # The names are checked before anything is assigned: the policy stays intact.
    with pytest.raises(
        ValueError, match=r"missing \['vla.projector.fc2.bias'\], unexpected \['vla.projector.fc4"
    ):
        load_weights(policy, folder)


def test_bc_targets_and_teacher_forced_mode(policy: OpenVLAPolicy) -> None:
    # The released convention: clip, digitize over linspace(-1, 1, 256), token = V - d.
    actions = torch.tensor([[[0.0, 0.5, -1.0, 1.0, 0.25, -0.3, 1.0]]])
    key, targets = policy.action_targets(actions)
    tok = policy.vla.action_tokenizer
    # No statistics, gripper_convention none: the actions are the normalised targets.
    assert torch.equal(targets, tok.encode(actions.view(1, 7)))
    libero = Normalizer(7, 0, "libero")
    saved, policy.normalizer = policy.normalizer, libero
    try:
        key, targets = policy.action_targets(actions)
    finally:
        policy.normalizer = saved
    normalized = torch.tensor([[0.0, 0.5, -1.0, 1.0, 0.25, -0.3, 0.0]])  # 1 - clip(g, 0, 1)
    assert key == K.ACTION_TOKENS and torch.equal(targets, tok.encode(normalized))
    with pytest.raises(ValueError, match="chunk to 1"):
        policy.action_targets(torch.zeros(1, 2, 7))
    # Greedy decoding is its own teacher: the teacher-forced mode of greedy tokens is them.
    obs = images(4, 9)
    prompts = [INSTRUCTIONS[0]] * 2 + [INSTRUCTIONS[1]] * 2
    greedy = policy.act(obs, prompts, None, temperature=1.0, do_sample=False).tokens
    with torch.no_grad():
        mode = policy.action_mode(trajectories(obs, greedy, INSTRUCTIONS))
    assert torch.equal(mode.view(2, 3, 7)[:, :2].reshape(4, 7).long(), greedy)
    assert bool((mode.view(2, 3, 7)[:, 2] == 0).all())
