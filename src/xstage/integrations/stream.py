"""Streaming a windowed decoder: codes in as they come, audio out a chunk at a time.

A stage exported with ``xstage export code2wav --chunk N --left-context M`` takes the next N
code frames per call and keeps the previous M in the worker (two state pairs: ``context``
and ``context_len``, docs/serving.md). ``stream(stage, pieces)`` (a generator) and
``astream(stage, pieces)`` (an async generator) feed it: pieces of any length (a talker's
frames one at a time, or a whole utterance) are cut into chunks of N, each chunk's audio is
yielded as soon as the stage returns it, and the tail (fewer than N frames) is right-padded
and its audio cut to its own length. The audio equals transformers'
``Qwen3OmniMoeCode2Wav.chunked_decode(codes, N, M)`` chunk for chunk (docs/pipelines.md has
the measured differences).

Rules:

1. The stream starts from the initial state (``stage.reset_state()`` first): one utterance
   per stream, and a stage streams one utterance at a time.
2. Each chunk yields ``N * samples_per_frame - lookahead_samples`` samples, the tail
   ``k * samples_per_frame - lookahead_samples`` for its k frames; ``lookahead_samples``
   (the manifest's ``stream`` block) are the last samples of a chunk, which need the next
   chunk's first frame and which ``chunked_decode`` leaves out too.
3. A result that says ``state_reset`` after the first (the worker was restarted and its
   context lost) ends the stream with ``StreamBroken``: audio decoded without its context
   is never yielded as if it had it.

It runs on every route that runs the stage's format: it only calls the stage. It lives
here, above ``stage``, because it is a user of the stage API (``Stage.__call__``,
``acall``, ``reset_state``, the artifact's manifest); ``client`` sits below the stage and
cannot see a ``Stage``. numpy only, like the stage API itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from xstage import errors

if TYPE_CHECKING:
    from xstage.stage.handle import Stage

__all__ = ["StreamBroken", "StreamSpec", "astream", "stream", "stream_spec"]


class StreamBroken(errors.XstageError):
    """Raised when the stage lost a stream's context mid-utterance (its worker restarted)."""


@dataclass(frozen=True)
class StreamSpec:
    """A windowed decoder's facts, from its manifest's ``stream`` block and signature."""

    codes: str  # the chunk's input
    wav: str  # the chunk's audio output
    chunk: int
    left_context: int
    quantizers: int
    samples_per_frame: int
    lookahead_samples: int
    sample_rate: int | None
    codebook_size: int | None  # codes lie in [0, codebook_size)

    def samples(self, frames: int) -> int:
        """The audio samples a chunk of ``frames`` real frames yields (rule 2)."""
        return frames * self.samples_per_frame - self.lookahead_samples


def stream_spec(stage: Stage) -> StreamSpec:
    """The stage's stream facts.

    Raises:
        UsageError: the stage is not a streaming window (its manifest has no ``stream``).
    """
    block = stage.artifact.manifest.get("stream")
    if not block:
        raise errors.UsageError(
            f"{stage.artifact.path.name} is not a streaming window (its manifest has no stream "
            "block)", remedy="export one with xstage export code2wav --chunk N --left-context M")
    shape = next(s.shape for s in stage.artifact.inputs if s.name == block["input"])
    return StreamSpec(codes=block["input"], wav=block["output"], chunk=int(block["chunk"]),
                      left_context=int(block["left_context"]), quantizers=int(shape[-2]),
                      samples_per_frame=int(block["samples_per_frame"]),
                      lookahead_samples=int(block["lookahead_samples"]),
                      sample_rate=block.get("sample_rate"),
                      codebook_size=block.get("codebook_size"))


class _Chunker:
    """Pieces of codes in, chunks of exactly ``spec.chunk`` frames out (the tail padded)."""

    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        self.parts: list[np.ndarray] = []
        self.held = 0
        self.seen = 0

    def push(self, piece: Any) -> Iterator[tuple[np.ndarray, int]]:
        codes = np.asarray(piece)
        q = self.spec.quantizers
        if codes.ndim == 3 and codes.shape[0] == 1:
            codes = codes[0]
        if codes.ndim != 2 or codes.shape[0] != q or codes.dtype.kind not in "iu":
            raise errors.InputError(
                f"piece {self.seen} of the stream is {codes.dtype}{list(codes.shape)}; the stage "
                f"takes integer codes [{q}, frames] (or [1, {q}, frames])",
                remedy="pass the talker's codes as [quantizers, frames] integer arrays")
        self.seen += 1
        if codes.shape[1]:
            self.parts.append(codes.astype(np.int64, copy=False))
            self.held += codes.shape[1]
        while self.held >= self.spec.chunk:
            yield self._take(self.spec.chunk), self.spec.chunk

    def tail(self) -> Iterator[tuple[np.ndarray, int]]:
        if self.held:
            k = self.held
            chunk = np.zeros((self.spec.quantizers, self.spec.chunk), np.int64)
            chunk[:, :k] = self._take(k)
            yield chunk, k

    def _take(self, n: int) -> np.ndarray:
        joined = np.concatenate(self.parts, axis=1) if len(self.parts) > 1 else self.parts[0]
        out, rest = joined[:, :n], joined[:, n:]
        self.parts = [rest] if rest.shape[1] else []
        self.held -= n
        return np.ascontiguousarray(out)


class _Run:
    """One utterance: the chunks' feeds, and each result checked and cut (rules 2 and 3)."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self.spec = stream_spec(stage)
        self.chunker = _Chunker(self.spec)
        self.calls = 0
        stage.reset_state()  # rule 1

    def feeds(self, chunk: np.ndarray) -> dict[str, np.ndarray]:
        return {self.spec.codes: chunk[None]}

    def audio(self, result: Mapping[str, np.ndarray], frames: int) -> np.ndarray:
        if self.calls and getattr(result, "state_reset", False):
            raise StreamBroken(
                f"chunk {self.calls} of the stream ran from the initial state (the stage's "
                "state was reset or its worker restarted): the utterance's context is gone",
                remedy="decode the utterance again from its first frame")
        self.calls += 1
        wav = np.asarray(result[self.spec.wav])
        return wav.reshape(-1)[:self.spec.samples(frames)].copy()


def stream(stage: Stage, pieces: Iterable[Any]) -> Iterator[np.ndarray]:
    """Yield each chunk's audio (float32, 1-D) as the stage decodes it; see the module rules.

    ``pieces``: integer codes ``[quantizers, frames]`` (or ``[1, quantizers, frames]``) of
    any length, in order; the tail is flushed when they end.

    Raises:
        UsageError: the stage is not a streaming window.
        InputError: a piece of another shape or dtype.
        StreamBroken: the stage's worker restarted mid-stream (rule 3).
    """
    run = _Run(stage)
    for piece in pieces:
        for chunk, frames in run.chunker.push(piece):
            yield run.audio(stage(run.feeds(chunk)), frames)
    for chunk, frames in run.chunker.tail():
        yield run.audio(stage(run.feeds(chunk)), frames)


async def astream(stage: Stage, pieces: AsyncIterable[Any] | Iterable[Any]) -> AsyncIterator[np.ndarray]:
    """``stream`` for asyncio: each chunk through ``stage.acall``; ``pieces`` may be async.

    Raises:
        UsageError: the stage is not a streaming window.
        InputError: a piece of another shape or dtype.
        StreamBroken: the stage's worker restarted mid-stream (rule 3).
    """
    run = _Run(stage)

    async def _pieces() -> AsyncIterator[Any]:
        if isinstance(pieces, AsyncIterable):
            async for piece in pieces:
                yield piece
        else:
            for piece in pieces:
                yield piece

    async for piece in _pieces():
        for chunk, frames in run.chunker.push(piece):
            yield run.audio(await stage.acall(run.feeds(chunk)), frames)
    for chunk, frames in run.chunker.tail():
        yield run.audio(await stage.acall(run.feeds(chunk)), frames)
