"""Generate with a vision-language model whose vision tower runs on an xstage stage.

The whole integration is five lines (export, open, offload, generate):

    report = export_vision_tower("tower/tower", family="qwen3_vl", config="tiny")
    stage = xstage.open_stage(report["path"], offload=True)       # the best offload route
    with stage, offload(model, "visual", stage):                   # the tower's module, replaced
        out = model.generate(**inputs, max_new_tokens=8)           # nothing else changes

This example does that with transformers' own ``Qwen3VLForConditionalGeneration`` (or
``--family qwen3_5``) built from tiny configs with fixed random weights, so it runs anywhere
with no download; with a real checkpoint, export the tower with ``xstage export vision-tower
--checkpoint DIR`` and load the model with ``from_pretrained``. It prints the stage's proof,
the generated tokens (against the tower in-process), and a timing table: time to first
token and the tower's time per request in-process and through the stage on each route.

``--overlap`` then runs the same request stream twice on the best offload route, with and
without overlap, and prints requests/s for each: with it, the next request's tower is submitted
(``Stage.submit``) before the current request generates, so the stage's worker computes it while
this process decodes; the proxy's call for that image then takes the finished future.

Run it in an environment with ``xstage[transformers,export]`` (torch, transformers):

    python examples/vl_generate.py [--family qwen3_vl|qwen3_5] [--requests 8] [--threads 1]
                                   [--overlap]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

try:
    import torch
    import transformers  # noqa: F401 - the models below are transformers'
except ImportError as exc:  # this example's own dependencies: say which, not a traceback
    raise SystemExit(f"error: examples/vl_generate.py needs torch and transformers ({exc})\n"
                     "hint: pip install -e '.[transformers,export]'") from None

import xstage
from xstage import errors
from xstage.export.vision_tower import export_vision_tower
from xstage.integrations.identity import greedy
from xstage.integrations.tiny import tiny_pairs, tiny_vl_model
from xstage.integrations.transformers import INPUT, find_module, offload
from xstage.record.summary import summary
from xstage.routes.specs import get_spec

ROUTES = ("ort-cpu", "ort-openvino", "torch-cpu")
PROOF_ROWS = ("status", "route", "device", "placement", "proof", "gate", "parity")


class TowerTimer:
    """Times whatever module sits at ``model.<name>`` (the tower, or the proxy in its place)."""

    def __init__(self, model: Any, name: str) -> None:
        self.model, self.name, self.seconds, self._t0 = model, name, [], 0.0
        self._hooks: list[Any] = []

    def __enter__(self) -> TowerTimer:
        module = self.model.get_submodule(self.name)
        self._hooks = [module.register_forward_pre_hook(self._start),
                       module.register_forward_hook(self._stop)]
        return self

    def __exit__(self, *exc: object) -> None:
        for hook in self._hooks:
            hook.remove()

    def _start(self, *_: Any) -> None:
        self._t0 = time.perf_counter()

    def _stop(self, *_: Any) -> None:
        self.seconds.append(time.perf_counter() - self._t0)


class Ahead:
    """A stage whose calls can be submitted ahead: a call whose inputs were submitted with
    ``submit_ahead`` takes that request's outputs (the same bytes, the same stage), any other
    call runs as it comes. Everything else is the stage's."""

    def __init__(self, stage: Any) -> None:
        self.stage = stage
        self.artifact = stage.artifact
        self._ahead: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stage, name)

    @staticmethod
    def _key(feeds: dict[str, Any]) -> str:
        h = hashlib.sha256()
        for name in sorted(feeds):
            h.update(name.encode())
            h.update(feeds[name].tobytes())
        return h.hexdigest()

    def submit_ahead(self, feeds: dict[str, Any]) -> None:
        self._ahead[self._key(feeds)] = self.stage.submit(feeds)

    def __call__(self, feeds: dict[str, Any]) -> Any:
        fut = self._ahead.pop(self._key(feeds), None)
        return fut.result() if fut is not None else self.stage(feeds)


def _tower_feed(proxy: Any, pair: Any) -> dict[str, Any]:
    """The stage inputs the proxy will build for ``pair``'s image (one call: ``g.images`` images)."""
    g = proxy.geometry
    patches = pair.inputs["pixel_values"].detach().to("cpu", torch.float32).numpy()
    feed = np.zeros((g.images * g.rows, g.patch_dim), np.float32)
    feed[: len(patches)] = patches
    return {INPUT: feed}


def _stream(model: Any, stage: Any, pairs: list[Any], tokens: int, overlap: bool) -> tuple[float, list[Any]]:
    """The request stream on ``stage``, one request after another; its wall time and tokens."""
    ahead = Ahead(stage)
    with offload(model, "visual", ahead, check=False) as proxy:
        t0 = time.perf_counter()
        if overlap:
            ahead.submit_ahead(_tower_feed(proxy, pairs[0]))
        runs = []
        for i, pair in enumerate(pairs):
            if overlap and i + 1 < len(pairs):  # the next tower computes while this one decodes
                ahead.submit_ahead(_tower_feed(proxy, pairs[i + 1]))
            runs.append(greedy(model, pair.inputs, tokens).tokens)
        return time.perf_counter() - t0, runs


def _overlap(model: Any, stage: Any, pairs: list[Any], tokens: int, rounds: int = 3) -> None:
    """Requests/s with and without overlap, the same stream and seed, in alternating rounds."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    outputs: dict[bool, list[Any]] = {}
    for r in range(rounds):
        for overlap in ((False, True) if r % 2 == 0 else (True, False)):
            seconds, outputs[overlap] = _stream(model, stage, pairs, tokens, overlap)
            rates[overlap].append(len(pairs) / seconds)
    same = "the same tokens" if outputs[True] == outputs[False] else "DIFFERENT tokens"
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"\noverlap on {stage.route}: {len(pairs)} requests x {rounds} rounds, {tokens} new tokens each "
          f"(medians): {off:.2f} requests/s without, {on:.2f} with ({on / off:.2f}x); {same}")


def _median_ms(values: list[float]) -> float:
    return 1e3 * statistics.median(values[1:] if len(values) > 1 else values)  # 1 warm-up


def _artifact(family: str, fmt: str, out: Path, cache: dict[str, str]) -> str:
    if fmt not in cache:
        report = export_vision_tower(out / fmt.replace(":", "-") / "tower", family=family,
                                     config="tiny", fmt=fmt)
        cache[fmt] = report["path"]
    return cache[fmt]


def _open_all(family: str, out: Path, threads: int | None) -> list[Any]:
    """The best offload route first (``offload=True``), then each other route of ROUTES."""
    towers: dict[str, str] = {}
    best = xstage.open_stage(_artifact(family, "onnx:fp32", out, towers), offload=True,
                             threads=threads)
    print(f"the best offload route: {best.route} on {best.device}")
    for line in summary(best.record()):
        if line.split(":", 1)[0] in PROOF_ROWS:
            print("  " + line)
    stages = [best]
    for route in ROUTES:
        if route == best.route:
            continue
        fmt = next(f for f in ("onnx:fp32", "pt:fp32") if f in get_spec(route).formats)
        try:
            stages.append(xstage.open_stage(_artifact(family, fmt, out, towers), route=route,
                                            threads=threads))
        except (errors.Refused, errors.RouteMissing) as exc:
            print(f"{route}: not measured ({exc.message})")
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", choices=("qwen3_vl", "qwen3_5"), default="qwen3_vl")
    parser.add_argument("--requests", type=int, default=8, help="(image, prompt) pairs, 1 warm-up")
    parser.add_argument("--tokens", type=int, default=8, help="new tokens per request")
    parser.add_argument("--threads", type=int, help="threads for the tower everywhere: torch here "
                        "and in torch workers (OMP_NUM_THREADS), onnxruntime's intra-op pool")
    parser.add_argument("--overlap", action="store_true", help="requests/s with and without the "
                        "next request's tower submitted while this one decodes (best route)")
    args = parser.parse_args()
    if args.threads:  # on a small, busy machine 2 threads of torch can be 15x slower than 1
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # workers inherit the environment
        torch.set_num_threads(args.threads)

    model = tiny_vl_model(args.family)
    name, _ = find_module(model, "visual")
    pairs = tiny_pairs(model, args.requests)
    with tempfile.TemporaryDirectory(prefix="vl-generate-") as tmp, contextlib.ExitStack() as opened:
        stages = [opened.enter_context(s) for s in _open_all(args.family, Path(tmp), args.threads)]
        where = ["in-process"] + [s.route for s in stages]
        runs: dict[str, list[Any]] = {w: [] for w in where}
        tower_s: dict[str, list[float]] = {w: [] for w in where}
        for pair in pairs:  # round by round, so load on the machine falls on every column alike
            for w, stage in zip(where, [None, *stages], strict=True):
                with contextlib.ExitStack() as block:
                    if stage is not None:
                        # The stage is checked against the module once, on the first request.
                        block.enter_context(offload(model, "visual", stage, check=pair.index == 0))
                    timer = block.enter_context(TowerTimer(model, name))
                    runs[w].append(greedy(model, pair.inputs, args.tokens))
                tower_s[w] += timer.seconds
        verdicts = {s.route: s.proof.verdict for s in stages}
        if args.overlap:
            _overlap(model, stages[0], pairs, args.tokens)
    local = [r.tokens for r in runs["in-process"]]
    best = [r.tokens for r in runs[stages[0].route]]
    print(f"pair 0 generated {best[0]} on {stages[0].route}; "
          f"{sum(a == b for a, b in zip(best, local, strict=True))} of {len(pairs)} pairs "
          "generate the same tokens as with the tower in-process")
    rows = [(w, verdicts.get(w, "-"), {
        "tokens": [r.tokens for r in runs[w]],
        "tower_ms": _median_ms(tower_s[w]),
        "ttft_ms": _median_ms([r.first_token_s for r in runs[w]]),
        "generate_ms": _median_ms([r.seconds for r in runs[w]])}) for w in where]
    print(f"\n{args.family}, {len(pairs) - 1} requests (medians, 1 warm-up left out; the columns "
          f"taken in turn, request by request), {args.tokens} new tokens each")
    head = ("tower on", "proof", "tower ms", "TTFT ms", "generate ms", "tokens")
    print("  ".join(h.ljust(12) for h in head))
    for w, verdict, r in rows:
        same = "same" if r["tokens"] == local else "DIFFERENT"
        cells = (w, verdict, f"{r['tower_ms']:.2f}", f"{r['ttft_ms']:.2f}",
                 f"{r['generate_ms']:.1f}", same)
        print("  ".join(c.ljust(12) for c in cells))


if __name__ == "__main__":
    main()
