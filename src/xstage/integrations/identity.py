"""Token for token: greedy generation with its logits, and two runs compared step by step.

``greedy`` runs ``model.generate`` (greedy, a fixed number of new tokens) and keeps the
logits of every step. ``compare`` judges a run against a reference run:

1. Identical: the same new tokens. The largest logit difference over all steps is reported.
2. Divergent: the first differing position ``k``. Up to ``k`` both runs saw the same tokens,
   so their logits at step ``k`` answer the same question. The reference's top-2 margin at
   ``k`` (its best logit minus its second best) is set against the largest logit difference
   between the two runs at ``k``: a divergence is **explained** when that margin is below that
   difference (the two runs disagree by more than what separated the two best tokens), and
   **unexplained** otherwise, which is a wrong number somewhere, not rounding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Comparison", "Generation", "compare", "count_changed", "greedy", "smallest_margin"]


@dataclass
class Generation:
    """One greedy run.

    Attributes:
        tokens: the new tokens.
        logits: ``[steps, vocab]`` float32, the logits each new token was picked from.
        seconds: the whole ``generate`` call.
        first_token_s: from the call to the first new token's logits.
    """

    tokens: list[int]
    logits: np.ndarray
    seconds: float = 0.0
    first_token_s: float = 0.0


@dataclass
class Comparison:
    """A run against a reference run; see the module docstring.

    Attributes:
        identical: the same new tokens.
        first_diff: the first differing position (None when identical).
        margin: the reference's top-2 logit margin at ``first_diff``.
        logit_diff: the largest logit difference at ``first_diff`` (at every step when identical).
        explained: a divergence whose margin is below its logit difference (None when identical).
    """

    identical: bool
    first_diff: int | None = None
    margin: float | None = None
    logit_diff: float = 0.0
    explained: bool | None = None
    steps: int = field(default=0)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dict(self.__dict__)


def compare(reference: Generation, run: Generation) -> Comparison:
    """Judge ``run`` against ``reference`` (same inputs, same number of new tokens)."""
    steps = min(len(reference.tokens), len(run.tokens))
    for k in range(steps):
        if reference.tokens[k] != run.tokens[k]:
            ref = reference.logits[k].astype(np.float64)
            top = np.sort(ref)[-2:]
            margin = float(top[1] - top[0])
            diff = float(np.max(np.abs(ref - run.logits[k].astype(np.float64))))
            return Comparison(False, k, margin, diff, margin < diff, steps)
    diff = float(np.max(np.abs(reference.logits[:steps].astype(np.float64)
                               - run.logits[:steps].astype(np.float64)))) if steps else 0.0
    return Comparison(len(reference.tokens) == len(run.tokens), None, None, diff, None, steps)


class _FirstToken:
    """A logits processor that notes when the first step's logits exist (nothing changes)."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.at is None:
            self.at = time.perf_counter()
        return scores


def greedy(model: Any, inputs: dict[str, Any], max_new_tokens: int = 8) -> Generation:
    """Greedy ``generate`` of exactly ``max_new_tokens`` tokens, keeping every step's logits."""
    import torch
    from transformers import LogitsProcessorList

    prompt = int(inputs["input_ids"].shape[1])
    first = _FirstToken()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             logits_processor=LogitsProcessorList([first]))
    seconds = time.perf_counter() - t0
    tokens = [int(t) for t in out.sequences[0, prompt:].tolist()]
    logits = np.stack([step[0].detach().float().cpu().numpy() for step in out.logits])
    return Generation(tokens, logits, seconds, (first.at or t0) - t0)


def smallest_margin(runs: Sequence[Generation]) -> float:
    """The smallest top-2 logit margin over every step of ``runs``: how close a call came."""
    margins = [float(np.diff(np.sort(r.logits.astype(np.float64), axis=1)[:, -2:], axis=1).min())
               for r in runs if len(r.logits)]
    return min(margins, default=float("inf"))


def count_changed(reference: Sequence[Generation], runs: Sequence[Generation]) -> int:
    """How many runs generated other tokens than their reference (the image-matters control)."""
    return sum(a.tokens != b.tokens for a, b in zip(reference, runs, strict=True))

