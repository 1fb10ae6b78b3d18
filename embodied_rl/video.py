"""Episode videos: MP4 (H.264) with the instruction above the image and the outcome below.

A frame of the written video is laid out top to bottom as

- a caption band: the instruction in white on a dark background, wrapped to the width;
- the episode frame, upscaled by an integer factor (nearest neighbour, so 16-64 px
  simulator frames stay crisp and visible);
- a bottom band (with an outcome or per-frame labels): the frame's label (e.g. the step
  counter ``step 12``) on dark, except on the last second of the video where it is filled
  green ("SUCCESS") or red ("FAILURE") with the word in white.

The canvas is padded so both sides are multiples of 16 (H.264 macro blocks; imageio would
otherwise resize every frame). Files are written under a temporary name in the target folder
and renamed into place, so a reader never sees a half-written video. :class:`VideoWriter`
writes frame by frame (a long episode at 256 px need not be held in memory);
:func:`write_video` writes frames already in memory.

PIL and imageio are imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import os
import uuid
from collections import deque
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodied_rl.checks import check_range

BACKGROUND = (24, 24, 24)  # caption/outcome band background
TEXT_COLOR = (255, 255, 255)
OUTCOME_COLORS = {"SUCCESS": (0, 170, 0), "FAILURE": (200, 0, 0)}
# imageio-ffmpeg starts its encoder with preexec_fn=os.setpgrp, which rules out vfork: the
# fork then needs commit charge for the whole parent, and a LIBERO worker with 16 rendering
# envs maps more virtual memory than the machine has RAM, so the fork fails with ENOMEM
# (Linux's default heuristic overcommit). This variable drops the preexec_fn (the process-
# group change only kept a terminal's Ctrl-C from the encoder; our workers stop it anyway).
os.environ.setdefault("IMAGEIO_FFMPEG_NO_PREVENT_SIGINT", "1")
MACRO_BLOCK = 16
TARGET_SIDE = 256  # auto scale: the largest integer factor keeping the long side <= this
_PAD = 4  # pixels of margin around text


def auto_scale(height: int, width: int, target: int = TARGET_SIDE) -> int:
    """Integer upscale factor for ``(height, width)`` frames: 16 px -> 16, 64 -> 4, 224 -> 1."""
    return max(1, target // max(height, width, 1))


def _round_up(value: int, multiple: int = MACRO_BLOCK) -> int:
    return -(-value // multiple) * multiple


def default_font(width: int) -> Any:
    """PIL's default font, sized to the video width (a bitmap font on old Pillow)."""
    from PIL import ImageFont

    size = max(10, min(18, width // 22))
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: no size argument
        return ImageFont.load_default()


def text_width(font: Any, text: str) -> float:
    """Width in pixels of ``text`` drawn with ``font``."""
    left, _, right, _ = font.getbbox(text)
    return right - left


def _line_height(font: Any) -> int:
    _, top, _, bottom = font.getbbox("Hg|")
    return int(bottom - min(top, 0)) + 2


def wrap_text(text: str, font: Any, max_width: int) -> list[str]:
    """Greedy word wrap of ``text`` to ``max_width`` pixels; over-long words are split.

    Returns:
        the lines (at least one; an empty text gives ``[""]``).
    """
    lines: list[str] = []
    current = ""
    for word in text.split():
        while text_width(font, word) > max_width and len(word) > 1:
            cut = len(word) - 1
            while cut > 1 and text_width(font, word[:cut]) > max_width:
                cut -= 1
            if current:
                lines.append(current)
                current = ""
            lines.append(word[:cut])
            word = word[cut:]
        candidate = f"{current} {word}" if current else word
        if current and text_width(font, candidate) > max_width:
            lines.append(current)
            candidate = word
        current = candidate
    lines.append(current)
    return lines


def _text_band(
    lines: list[str], font: Any, width: int, height: int, fill: tuple[int, int, int]
) -> np.ndarray:
    """A ``(height, width, 3)`` uint8 band with ``lines`` drawn left-aligned from the top."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), fill)
    draw = ImageDraw.Draw(image)
    step = _line_height(font)
    for i, line in enumerate(lines):
        draw.text((_PAD, _PAD + i * step), line, font=font, fill=TEXT_COLOR)
    return np.asarray(image, dtype=np.uint8)


def _check_frames(frames: Any) -> np.ndarray:
    """``frames`` as a ``(T, H, W, 3)`` uint8 array (numpy or CPU torch tensor accepted)."""
    array = np.asarray(frames.cpu() if hasattr(frames, "cpu") else frames)
    if array.ndim != 4 or array.shape[-1] != 3 or array.shape[0] < 1:
        raise ValueError(f"frames must be (T>=1, H, W, 3), got shape {tuple(array.shape)}")
    if array.dtype != np.uint8:
        raise ValueError(f"frames must be uint8, got {array.dtype}; convert with .astype(uint8)")
    return array


@dataclass(frozen=True)
class FrameLayout:
    """Where things sit on a composed video frame (pixels; sides multiples of 16).

    Attributes:
        top: height of the caption band (0 without a caption); the image starts here.
        left: first column of the image (it is centred horizontally).
        image_height / image_width: the upscaled episode frame.
        height / width: the whole frame.
        scale: the integer upscale factor.
        lines: the wrapped caption lines.
    """

    top: int
    left: int
    image_height: int
    image_width: int
    height: int
    width: int
    scale: int
    lines: tuple[str, ...]

    @property
    def bottom(self) -> int:
        """First row of the bottom band (below the image: labels and outcome)."""
        return self.top + self.image_height


def frame_layout(
    height: int,
    width: int,
    caption: str | None,
    outcome: str | None,
    scale: int | None = None,
    labels: bool = False,
) -> FrameLayout:
    """The layout :func:`compose_frames` uses for ``(height, width)`` episode frames.

    A bottom band is there when there is an ``outcome`` or per-frame ``labels``.
    """
    scale = auto_scale(height, width) if scale is None else int(scale)
    check_range("scale", scale, 1)
    full_width = _round_up(width * scale)
    font = default_font(full_width)
    lines = wrap_text(caption, font, full_width - 2 * _PAD) if caption is not None else []
    top = len(lines) * _line_height(font) + 2 * _PAD if lines else 0
    has_band = outcome is not None or labels
    bottom = _line_height(font) + 2 * _PAD if has_band else 0
    full_height = _round_up(top + height * scale + bottom)  # the slack goes below the image
    left = (full_width - width * scale) // 2
    return FrameLayout(
        top, left, height * scale, width * scale, full_height, full_width, scale, tuple(lines)
    )


def _check_outcome(outcome: str | None) -> None:
    if outcome is not None and outcome not in OUTCOME_COLORS:
        raise ValueError(
            f"outcome must be one of {sorted(OUTCOME_COLORS)} or None, got {outcome!r}"
        )


class _Composer:
    """Composes the frames of one video: the layout and the caption band are made once."""

    def __init__(
        self,
        height: int,
        width: int,
        caption: str | None,
        outcome: str | None,
        scale: int | None,
        labels: bool,
    ) -> None:
        _check_outcome(outcome)
        self.outcome = outcome
        self.has_band = outcome is not None or labels
        self.layout = frame_layout(height, width, caption, outcome, scale, labels)
        self.font = default_font(self.layout.width)
        lay = self.layout
        self.caption_band = (
            _text_band(list(lay.lines), self.font, lay.width, lay.top, BACKGROUND)
            if lay.lines
            else None
        )

    def compose(self, frames: np.ndarray, labels: list[str | None], final: bool) -> np.ndarray:
        """``(t, H2, W2, 3)`` uint8 from ``(t, H, W, 3)`` frames.

        Args:
            frames: the episode frames (all of the size the layout was made for).
            labels: one text per frame for the bottom band (``None``: no text).
            final: these are the last frames: the band shows the outcome in its colour.
        """
        lay = self.layout
        t, h, w, _ = frames.shape
        if (h * lay.scale, w * lay.scale) != (lay.image_height, lay.image_width):
            raise ValueError(
                f"all frames of a video must have one size: {h}x{w} after "
                f"{lay.image_height // lay.scale}x{lay.image_width // lay.scale}"
            )
        canvas = np.empty((t, lay.height, lay.width, 3), dtype=np.uint8)
        canvas[:] = np.asarray(BACKGROUND, dtype=np.uint8)
        image = frames.repeat(lay.scale, axis=1).repeat(lay.scale, axis=2)
        canvas[:, lay.top : lay.bottom, lay.left : lay.left + lay.image_width] = image
        if self.caption_band is not None:
            canvas[:, : lay.top] = self.caption_band
        if self.has_band:
            for i, label in enumerate(labels):
                canvas[i, lay.bottom :] = self._bottom_band(label, final)
        return canvas

    def _bottom_band(self, label: str | None, final: bool) -> np.ndarray:
        """The band below the image: ``label``, in the outcome's colour on final frames."""
        lay = self.layout
        outcome = self.outcome if final else None
        fill = OUTCOME_COLORS[outcome] if outcome is not None else BACKGROUND
        text = "   ".join(part for part in (outcome, label) if part)
        return _text_band([text], self.font, lay.width, lay.height - lay.bottom, fill)


def compose_frames(
    frames: Any,
    caption: str | None = None,
    outcome: str | None = None,
    scale: int | None = None,
    outcome_frames: int = 10,
    labels: Sequence[str] | None = None,
) -> np.ndarray:
    """Lay out the video frames: caption band, upscaled frame, bottom band; sides % 16 == 0.

    Args:
        frames: ``(T, H, W, 3)`` uint8 episode frames.
        caption: text of the top band (the instruction); ``None`` = no caption band.
        outcome: ``"SUCCESS"`` or ``"FAILURE"`` shown on the last ``outcome_frames`` frames;
            ``None`` = no outcome.
        scale: integer upscale factor; ``None`` picks :func:`auto_scale`.
        outcome_frames: how many final frames show the outcome (all frames if fewer).
        labels: ``T`` texts written in the bottom band, one per frame (e.g. the step
            counter); ``None`` = none (then the band is there only with an outcome).

    Returns:
        ``(T, H2, W2, 3)`` uint8 with ``H2`` and ``W2`` multiples of 16 (see
        :func:`frame_layout`).
    """
    array = _check_frames(frames)
    t, h, w, _ = array.shape
    if labels is not None and len(labels) != t:
        raise ValueError(f"labels must have one text per frame ({t}), got {len(labels)}")
    composer = _Composer(h, w, caption, outcome, scale, labels is not None)
    texts: list[str | None] = list(labels) if labels is not None else [None] * t
    cut = max(0, t - outcome_frames)
    return np.concatenate(
        [
            composer.compose(array[:cut], texts[:cut], final=False),
            composer.compose(array[cut:], texts[cut:], final=True),
        ]
    )


class VideoWriter:
    """An episode's H.264 MP4, written frame by frame (memory: ``fps`` frames), atomically.

    Frames are composed as :func:`compose_frames` lays them out, the outcome on the last
    second (``fps`` frames): those are held back until :meth:`close`, when it is known which
    frames are last. The file is written under a temporary name in the target folder and
    renamed into place by :meth:`close`; :meth:`abort` (or an exception inside a ``with``
    block) removes it, leaving an older file of the same name untouched.

    Args:
        path: the ``.mp4`` file to write (its folder is created).
        fps: frames per second.
        caption: the instruction written above the image (wrapped); ``None`` for none.
        outcome: ``"SUCCESS"`` (green) or ``"FAILURE"`` (red) on the last frames, or ``None``.
        scale: integer upscale factor; ``None`` = :func:`auto_scale` (small frames grow).
        labels: whether :meth:`append` gets a text per frame for the bottom band.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        fps: int = 10,
        caption: str | None = None,
        outcome: str | None = None,
        scale: int | None = None,
        labels: bool = False,
    ) -> None:
        check_range("fps", fps, 1)
        _check_outcome(outcome)
        self.path = Path(path)
        self.fps = int(fps)
        self.frames = 0  # appended so far
        self._options = (caption, outcome, scale, labels)
        self._composer: _Composer | None = None
        self._held: deque[tuple[np.ndarray, str | None]] = deque()
        self._stack = ExitStack()
        self._writer: Any = None
        # Same folder (so the rename is atomic), hidden, and still ending in .mp4 for ffmpeg.
        self._partial = self.path.with_name(f".{self.path.stem}.{uuid.uuid4().hex[:8]}.partial.mp4")

    def append(self, frame: Any, label: str | None = None) -> None:
        """Add one ``(H, W, 3)`` uint8 frame (all of one size), with its bottom-band text."""
        array = _check_frames(np.asarray(frame)[None])[0]
        if self._composer is None:
            caption, outcome, scale, labels = self._options
            self._composer = _Composer(*array.shape[:2], caption, outcome, scale, labels)
            self._open()
        self._held.append((array, label))
        self.frames += 1
        if len(self._held) > self.fps:  # no longer among the last second's frames
            self._write(*self._held.popleft(), final=False)

    def close(self) -> Path:
        """Write the held-back frames with the outcome and move the file into place."""
        if self._composer is None:
            raise ValueError(f"{self.path}: a video needs at least one frame")
        try:
            while self._held:
                self._write(*self._held.popleft(), final=True)
            self._stack.close()  # flushes and closes the encoder
            os.replace(self._partial, self.path)
        finally:
            self.abort()
        return self.path

    def abort(self) -> None:
        """Stop writing and remove the partial file (idempotent)."""
        self._held.clear()
        try:
            self._stack.close()
        finally:
            self._partial.unlink(missing_ok=True)

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _open(self) -> None:
        import imageio.v2 as imageio

        self.path.parent.mkdir(parents=True, exist_ok=True)
        writer = imageio.get_writer(
            str(self._partial),
            format="FFMPEG",
            mode="I",
            fps=self.fps,
            codec="libx264",
            pixelformat="yuv420p",
            macro_block_size=MACRO_BLOCK,
            quality=8,
            ffmpeg_log_level="error",
        )
        self._writer = self._stack.enter_context(writer)

    def _write(self, frame: np.ndarray, label: str | None, final: bool) -> None:
        self._writer.append_data(self._composer.compose(frame[None], [label], final)[0])


def write_video(
    path: str | os.PathLike,
    frames: Any,
    fps: int = 10,
    caption: str | None = None,
    outcome: str | None = None,
    scale: int | None = None,
    labels: Sequence[str] | None = None,
) -> Path:
    """Write an episode as an H.264 MP4 with its instruction and outcome, atomically.

    Args:
        path: the ``.mp4`` file to write (its folder is created).
        frames: ``(T, H, W, 3)`` uint8 frames (numpy array or CPU tensor).
        fps: frames per second; the outcome is shown on the last second (``fps`` frames).
        caption: the instruction written above the image (wrapped); ``None`` for none.
        outcome: ``"SUCCESS"`` (green) or ``"FAILURE"`` (red) on the last frames, or ``None``.
        scale: integer upscale factor; ``None`` = :func:`auto_scale` (small frames grow).
        labels: ``T`` texts for the bottom band (e.g. ``"step 3"``), or ``None``.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    array = _check_frames(frames)
    if labels is not None and len(labels) != len(array):
        raise ValueError(f"labels must have one text per frame ({len(array)}), got {len(labels)}")
    with VideoWriter(path, fps, caption, outcome, scale, labels is not None) as video:
        for i, frame in enumerate(array):
            video.append(frame, None if labels is None else labels[i])
    return video.path


def read_video(path: str | os.PathLike) -> np.ndarray:
    """All frames of a video file as ``(T, H, W, 3)`` uint8."""
    import imageio.v2 as imageio

    with imageio.get_reader(str(path), format="FFMPEG") as reader:
        frames = [np.asarray(frame, dtype=np.uint8)[..., :3] for frame in reader]
    if not frames:
        raise ValueError(f"{path} holds no frames")
    return np.stack(frames)
