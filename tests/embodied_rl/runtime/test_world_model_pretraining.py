"""World-model pretraining end to end (pretrain_vjepa_libero on 2 Ray workers): the V-JEPA loss
falls, the export loads as SRPO's ``video_encoder.vjepa2``, the loader kept held-out videos out.

Data: synthetic LIBERO demo files (successes, brightening frames) and an episode video file of
failures (frames that stay dark), both written by the real writers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from embodied_rl.data.episode_videos import EpisodeVideo, write_episode_videos
from embodied_rl.export.run import export_run
from embodied_rl.launch.launcher import launch
from embodied_rl.registry import model_builder
from embodied_rl.runtime.config import compose
from tests.embodied_rl.synthetic_demos import write_synthetic_demos

pytestmark = pytest.mark.ray

TINY = {
    "crop_size": 16,
    "frames_per_clip": 4,
    "patch_size": 4,
    "tubelet_size": 2,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "mlp_ratio": 2.0,
    "pred_hidden_size": 16,
    "pred_num_hidden_layers": 1,
    "pred_num_attention_heads": 2,
    "pred_mlp_ratio": 2.0,
    "pred_num_mask_tokens": 2,
}
STEPS = 30


def failures(folder, size=16, length=12):
    """Episodes of the demo tasks that never brighten; init state 4 (validation) among them."""
    rng = np.random.default_rng(0)
    videos = [
        EpisodeVideo(
            rng.integers(0, 40, (length, size, size, 3), dtype=np.uint8),
            "put the bowl on the plate",
            False,
            0,
            init,
        )
        for init in (0, 1, 2, 4)
    ]
    return write_episode_videos(folder / "failures.hdf5", videos, suite="libero_spatial")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    data = tmp_path_factory.mktemp("videos")
    write_synthetic_demos(data, tasks=2, demos=4, length=12, size=16)
    failures(data)
    options = [f"models.world_model.options.config.{k}={v}" for k, v in TINY.items()]
    overrides = [
        f"data.paths=['{data}']",
        "data.image_size=16",
        "data.batch_size=8",
        "models.world_model.options.num_frames=4",
        "models.world_model.options.resize_short=16",
        "models.world_model.options.crop_size=16",
        *options,
        "models.world_model.optimizer.lr=1e-3",
        "models.world_model.optimizer.warmup_steps=0",
        "algorithm.world_model.micro_batch_size=2",
        "algorithm.world_model.num_blocks=2",
        "workers.num_workers=2",
        "workers.torch_threads=1",
        f"trainer.total_steps={STEPS}",
        f"trainer.checkpoint_every={STEPS}",
        "trainer.log_to_console=false",
        f"run_dir={tmp_path_factory.mktemp('run')}",
    ]
    return launch(compose("pretrain_vjepa_libero", overrides), show_progress=False)


def test_the_latent_prediction_loss_falls(pretrained):
    lines = [
        json.loads(line) for line in (pretrained.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in lines] == list(range(STEPS))
    loss = [m["world_model/loss"] for m in lines]
    assert np.mean(loss[-5:]) < 0.8 * np.mean(loss[:3]), loss
    assert all(m["world_model/skipped_updates"] == 0 for m in lines)
    assert lines[-1]["world_model/target_std"] > 0.05  # no collapse to a constant
    assert lines[0]["world_model/momentum"] == pytest.approx(0.99)
    assert lines[-1]["world_model/momentum"] == pytest.approx(0.999)
    # 8 demos + 4 failures, the failure from init state 4 (validation) left out
    assert lines[0]["data/dropped_heldout_init_state"] == 1


def test_the_export_is_the_srpo_encoder(pretrained, tmp_path):
    result = export_run(pretrained.run_dir, tmp_path / "vjepa")
    (model,) = result.models
    _, policy, options = model.loading.also["As SRPO's trajectory encoder (encode.video)"]
    encoder = model_builder(policy)(options, torch.device("cpu"))
    trained = model_builder("world_model.vjepa2")(model.loading.options, torch.device("cpu"))
    videos = torch.randint(0, 256, (3, 6, 16, 16, 3), dtype=torch.uint8)
    lengths = torch.tensor([6, 4, 0])
    embedded = encoder.encode(videos, lengths)
    assert embedded.shape == (3, 32) and embedded[2].abs().sum() == 0  # length 0: invalid
    clip = videos[:1, [0, 1, 3, 5]]  # the encoder's 4 frames spread over 6
    expected = trained.target(trained.pixels(clip)).last_hidden_state.mean(dim=1)
    torch.testing.assert_close(embedded[:1], expected)
    card = (tmp_path / "vjepa" / "README.md").read_text()
    assert "policy: video_encoder.vjepa2" in card
