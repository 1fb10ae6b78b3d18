"""Episode MP4s: round trip through H.264, caption band, outcome colour, per-frame labels,
frame-by-frame writing, atomic writes."""

from __future__ import annotations

import imageio.v2
import numpy as np
import pytest
import torch

from embodied_rl.video import (
    BACKGROUND,
    OUTCOME_COLORS,
    VideoWriter,
    auto_scale,
    compose_frames,
    default_font,
    frame_layout,
    read_video,
    text_width,
    wrap_text,
    write_video,
)

CAPTION = "put the black bowl on the plate next to the cookie box and close the drawer"


def _frames(t: int = 12, size: int = 16) -> np.ndarray:
    """(t, size, size, 3) uint8: a blue square on black whose red level grows with time."""
    frames = np.zeros((t, size, size, 3), dtype=np.uint8)
    frames[:, 4:12, 4:12, 2] = 255
    frames[:, 4:12, 4:12, 0] = (np.arange(t) * 20)[:, None, None]
    return frames


def _layout(frames: np.ndarray, caption: str | None, outcome: str | None):
    return frame_layout(frames.shape[1], frames.shape[2], caption, outcome)


def test_round_trip_frame_count_size_and_content(tmp_path):
    frames = _frames()
    path = write_video(tmp_path / "ep.mp4", frames, fps=10, caption=CAPTION, outcome="SUCCESS")
    assert path.is_file() and path.stat().st_size > 1000
    video = read_video(path)
    expected = compose_frames(frames, CAPTION, "SUCCESS", outcome_frames=10)
    assert video.shape == expected.shape
    assert video.shape[0] == 12 and video.shape[2] == 256  # 16 px upscaled x16
    assert video.shape[1] % 16 == 0 and video.shape[1] > 256  # image plus two bands
    # H.264 is lossy but close on flat colours: compare to the composed frames.
    assert np.abs(video.astype(int) - expected.astype(int)).mean() < 3.0
    lay = _layout(frames, CAPTION, "SUCCESS")
    assert (lay.scale, lay.left, lay.image_height) == (16, 0, 256)
    square = video[:, lay.top + 8 * 16, 8 * 16]  # centre of the square in every frame
    assert np.allclose(square[:, 2], 255, atol=12)
    assert np.allclose(square[:, 0], np.arange(12) * 20, atol=12)


def test_caption_band_has_text_on_background(tmp_path):
    frames = _frames(t=3)
    video = read_video(write_video(tmp_path / "c.mp4", frames, caption=CAPTION))
    top = _layout(frames, CAPTION, None).top
    band = video[0, :top].astype(int)
    assert top >= 2 * 10  # the long caption wraps onto at least two lines
    assert (band.max(axis=-1) > 180).sum() > 50  # white text pixels
    near_background = np.abs(band - np.array(BACKGROUND)).max(axis=-1) <= 20
    assert near_background.mean() > 0.6
    bare = read_video(write_video(tmp_path / "b.mp4", frames))
    assert bare.shape[1] == 256  # no band at all without a caption


@pytest.mark.parametrize("outcome, channel", [("SUCCESS", 1), ("FAILURE", 0)], ids=["green", "red"])
def test_outcome_colour_on_last_frames_only(tmp_path, outcome, channel):
    frames = _frames(t=14)
    video = read_video(write_video(tmp_path / "o.mp4", frames, fps=10, outcome=outcome))
    bottom = _layout(frames, None, outcome).bottom
    assert video.shape[1] - bottom >= 16
    last = video[-1, bottom + 2 :].reshape(-1, 3).astype(float)
    first = video[0, bottom + 2 :].reshape(-1, 3).astype(float)
    mean_last = last.mean(axis=0)
    assert mean_last[channel] > 130
    assert all(mean_last[c] < 70 for c in range(3) if c != channel)
    assert first.mean(axis=0).max() < 50  # frames 0-3 are before the last second (fps=10)
    assert video[4, bottom + 2 :].reshape(-1, 3).mean(axis=0)[channel] > 130


def test_write_is_atomic_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = write_video(tmp_path / "v.mp4", _frames(t=4), fps=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4"]  # no temp file left
    before = read_video(path)

    real_get_writer = imageio.v2.get_writer

    class Failing:
        def __init__(self, *args, **kwargs):
            self.inner = real_get_writer(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.inner.close()

        def append_data(self, frame):
            raise RuntimeError("disk full")

    monkeypatch.setattr(imageio.v2, "get_writer", Failing)
    with pytest.raises(RuntimeError, match="disk full"):
        write_video(path, _frames(t=9), fps=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4"]
    assert np.array_equal(read_video(path), before)


def test_tensor_input_and_odd_sizes_pad_to_macro_blocks():
    frames = torch.from_numpy(np.full((2, 20, 30, 3), 90, dtype=np.uint8))
    out = compose_frames(frames, None, None, scale=1)
    assert out.shape == (2, 32, 32, 3)
    assert (out[:, :20, 1:31] == 90).all()  # the image, centred horizontally
    assert (out[:, 20:] == np.array(BACKGROUND)).all()


def test_auto_scale_and_bad_inputs():
    assert [auto_scale(s, s) for s in (16, 64, 100, 224, 512)] == [16, 4, 2, 1, 1]
    with pytest.raises(ValueError, match="uint8"):
        compose_frames(np.zeros((2, 8, 8, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="T>=1"):
        compose_frames(np.zeros((8, 8, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="outcome"):
        compose_frames(_frames(t=1), outcome="WIN")


def test_wrap_text_fits_width_and_keeps_words():
    font = default_font(128)
    lines = wrap_text(CAPTION + " supercalifragilisticexpialidocious", font, 100)
    assert len(lines) > 3
    assert all(text_width(font, line) <= 100 for line in lines)
    assert "".join(lines).replace(" ", "") == (
        CAPTION + "supercalifragilisticexpialidocious"
    ).replace(" ", "")
    assert wrap_text("", font, 100) == [""]


def test_writer_streams_labels_and_shows_the_outcome_on_the_last_second(tmp_path):
    frames = _frames(t=9)
    labels = [f"step {t}" for t in range(9)]
    with VideoWriter(tmp_path / "s.mp4", 3, CAPTION, "FAILURE", labels=True) as video:
        for frame, label in zip(frames, labels):
            video.append(frame, label)
    assert video.frames == 9 and sorted(p.name for p in tmp_path.iterdir()) == ["s.mp4"]
    written = read_video(tmp_path / "s.mp4").astype(int)
    expected = compose_frames(frames, CAPTION, "FAILURE", outcome_frames=3, labels=labels)
    assert written.shape == expected.shape  # frame by frame = all at once
    assert np.abs(written - expected).mean() < 3.0
    band = expected[:, _layout(frames, CAPTION, "FAILURE").bottom :].astype(int)
    assert all(not np.array_equal(band[t], band[t + 1]) for t in range(5))  # the label changes
    text = band[:6].max(axis=-1) > 180  # white label text on the dark band ...
    assert text.any(axis=(1, 2)).all() and text.mean() < 0.2
    dark = np.abs(band[:6] - np.array(BACKGROUND)).max(axis=-1) <= 20
    assert dark.mean() > 0.7
    red = np.abs(band[6:] - np.array(OUTCOME_COLORS["FAILURE"])).max(axis=-1) <= 20
    assert red.mean() > 0.7  # ... and red on the last second (fps 3)
    assert not np.array_equal(band[6], band[7])  # still labelled there


def test_writer_abort_leaves_nothing_and_bad_inputs_are_refused(tmp_path):
    video = VideoWriter(tmp_path / "a.mp4", fps=2)
    video.append(_frames(t=1)[0])
    video.abort()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="one size"):
        with VideoWriter(tmp_path / "b.mp4") as mixed:
            mixed.append(np.zeros((16, 16, 3), np.uint8))
            mixed.append(np.zeros((32, 32, 3), np.uint8))
    assert list(tmp_path.iterdir()) == []  # the exception removed the partial file
    with pytest.raises(ValueError, match="at least one frame"):
        VideoWriter(tmp_path / "c.mp4").close()
    with pytest.raises(ValueError, match="fps must be >= 1"):
        VideoWriter(tmp_path / "d.mp4", fps=0)
    with pytest.raises(ValueError, match="one text per frame"):
        compose_frames(_frames(t=2), labels=["step 0"])
