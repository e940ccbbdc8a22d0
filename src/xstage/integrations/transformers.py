"""A transformers model's vision tower on an xstage stage, for the length of a ``with`` block.

    stage = xstage.open_stage("tower.onnx", offload=True)
    with offload(model, "visual", stage):
        tokens = model.generate(input_ids=..., pixel_values=..., image_grid_thw=..., ...)

``offload`` replaces one submodule (``model.model.visual`` for ``"visual"``) by a
``StageTower``: an ``nn.Module`` with no parameters that takes what the model hands its
tower (``pixel_values``, one row per patch, and ``grid_thw``, one row per image), turns it
into the stage's fixed-shape input, runs the stage and gives back what the tower would have:
``pooler_output`` (the merged embeddings) and, for Qwen3-VL, ``deepstack_features``, as
tensors of the tower's dtype on the device of ``pixel_values``. Nothing else in the model
changes; leaving the block (normally or by an exception) puts the original module back.

Rules the proxy keeps:

1. The stage's geometry comes from its manifest: ``xstage export vision-tower`` writes the
   images it was exported for on its ``patches`` input (``grid_thw``). A stage without it
   (the shipped ``vision-tower-tiny``) needs ``image_size=(H, W)``.
2. Every image's grid must be the stage's: an image of another size is an ``InputError``
   naming both sizes (in patches and in pixels) and the re-export that would take it.
3. A stage exported for N images takes the images N at a time; a last, partial group is
   padded with zero patches, whose outputs are dropped (attention never crosses images).
4. Before the block starts, the stage must describe this tower: the patch width, the
   output width and one ``deepstack_<i>`` per deepstack merger. With ``check=True``
   (the default) the stage and the module also run once on the stage's own admitted inputs
   and must agree (relative L2 ≤ ``check_tolerance``), which catches a stage exported from
   other weights.
5. One module is offloaded once: offloading a path that already holds a ``StageTower`` is
   a ``UsageError``.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from xstage import errors

if TYPE_CHECKING:
    from xstage.stage import Stage

__all__ = ["TowerGeometry", "find_module", "offload", "stage_tower_class"]

#: The stage's input and outputs, as ``xstage export vision-tower`` names them.
INPUT = "patches"
EMBEDS = "embeds"
DEEPSTACK = "deepstack_{}"
#: Rule 4's default bar by the tower's dtype: the stage computes in float32, a half-precision
#: tower does not; a stage of other weights is off by ~1 (relative L2), far above any of these.
CHECK_TOLERANCE = {"float32": 1e-3, "float16": 1e-2, "bfloat16": 5e-2}


def _torch() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise errors.UsageError(
            f"xstage.integrations.transformers needs torch and transformers ({exc.name} is not "
            "importable here)", remedy="python3 -m pip install 'xstage[transformers]'") from exc
    return torch, transformers


@dataclass(frozen=True)
class TowerGeometry:
    """What a stage was exported for: ``images`` images of ``grid`` (t, h, w) patches each.

    Attributes:
        images: how many images one call of the stage takes.
        grid: one image's grid in patches, ``(t, h, w)``.
        patch_dim: the width of one patch row (channels x temporal patch x patch x patch).
        merge: the spatial merge size (``merge``² patches make one output token).
        patch_size: one patch's side in pixels (for messages only).
    """

    images: int
    grid: tuple[int, int, int]
    patch_dim: int
    merge: int
    patch_size: int

    @property
    def rows(self) -> int:
        """Patch rows per image."""
        t, h, w = self.grid
        return t * h * w

    @property
    def tokens(self) -> int:
        """Output rows (merged tokens) per image."""
        return self.rows // (self.merge * self.merge)

    def describe(self, grid: Sequence[int]) -> str:
        """``4x4 patches (64x64 pixels)`` for a ``(t, h, w)`` grid."""
        t, h, w = (int(x) for x in grid)
        frames = f", {t} frames" if t != 1 else ""
        return f"{h}x{w} patches ({h * self.patch_size}x{w * self.patch_size} pixels{frames})"


def _geometry(stage: Any, config: Any, image_size: tuple[int, int] | None) -> TowerGeometry:
    """Rule 1: the stage's images and grid, from its manifest or from ``image_size``."""
    art = stage.artifact
    specs = {s.name: s for s in art.inputs}
    if INPUT not in specs or len(specs[INPUT].shape) != 2:
        raise errors.UsageError(
            f"the stage {art.path.name} takes {sorted(specs)}, not one 2-D {INPUT!r} input",
            remedy="open a vision tower exported by xstage export vision-tower")
    rows, width = (int(d) for d in specs[INPUT].shape)
    p, m = int(config.patch_size), int(config.spatial_merge_size)
    tp = int(getattr(config, "temporal_patch_size", 1))
    patch_dim = int(config.in_channels) * tp * p * p
    if width != patch_dim:
        raise errors.UsageError(
            f"the stage's patches are {width} wide, the model's tower takes {patch_dim} "
            f"({config.in_channels} channels x {tp} x {p} x {p})",
            remedy="export the tower of this model (same patch size and channels)")
    declared = next((d.get("grid_thw") for d in art.manifest.get("inputs", ())
                     if isinstance(d, Mapping) and d.get("name") == INPUT), None)
    if image_size is not None:
        h, w = image_size
        if h % (p * m) or w % (p * m):
            raise errors.UsageError(f"image_size {h}x{w} is not a multiple of {p * m} "
                                    "(patch size x merge size)")
        grid = (1, h // p, w // p)
        per = grid[1] * grid[2]
        if rows % per:
            raise errors.UsageError(
                f"image_size {h}x{w} is {per} patches an image; the stage takes {rows} rows",
                remedy="give the image size the stage was exported at")
        grids = [list(grid)] * (rows // per)
        if declared is not None and declared != grids:
            raise errors.UsageError(
                f"image_size {h}x{w} contradicts the stage's manifest (grid_thw {declared})",
                remedy="drop image_size: the manifest says what the stage takes")
    elif declared is not None:
        grids = declared
    else:
        raise errors.UsageError(
            f"the stage {art.path.name} does not say which image size it was exported at "
            "(its manifest has no grid_thw on 'patches')",
            remedy="pass image_size=(H, W), or re-export it with xstage export vision-tower")
    if not grids or any(list(g) != list(grids[0]) for g in grids) \
            or sum(int(np.prod(g)) for g in grids) != rows:
        raise errors.ArtifactError(
            f"the stage's grid_thw {grids} does not cover its {rows} patch rows",
            remedy="re-export the tower with xstage export vision-tower")
    t, h, w = (int(x) for x in grids[0])
    return TowerGeometry(images=len(grids), grid=(t, h, w), patch_dim=patch_dim, merge=m,
                         patch_size=p)


class _Calls:
    """What the proxy did: one entry per stage call (images, seconds), for timing tables."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def add(self, images: int, seconds: float) -> None:
        self.entries.append({"images": images, "seconds": seconds})

    def clear(self) -> None:
        self.entries.clear()

    @property
    def seconds(self) -> float:
        return sum(e["seconds"] for e in self.entries)


def _check_grids(g: TowerGeometry, grid_thw: Any) -> list[list[int]]:
    """Rule 2: every image's grid is the stage's, or an ``InputError`` naming both."""
    grids = [[int(x) for x in row] for row in grid_thw.tolist()]
    for i, grid in enumerate(grids):
        if tuple(grid) != g.grid:
            t, h, w = grid
            size = f"{h * g.patch_size}x{w * g.patch_size}"
            raise errors.InputError(
                f"image {i} is {g.describe(grid)}; the stage was exported for {g.describe(g.grid)}",
                remedy=f"resize the image to {g.grid[1] * g.patch_size}x{g.grid[2] * g.patch_size}"
                f", or export the tower at that size (xstage export vision-tower --image-size "
                f"{size}) and open that stage")
    return grids


def _run_batches(stage: Any, g: TowerGeometry, patches: np.ndarray, images: int,
                 names: Sequence[str], calls: _Calls) -> dict[str, np.ndarray]:
    """Rule 3: ``images`` images through the stage N at a time; outputs by name, padding dropped."""
    feed = np.zeros((g.images * g.rows, g.patch_dim), np.float32)
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for start in range(0, images, g.images):
        n = min(g.images, images - start)
        feed[: n * g.rows] = patches[start * g.rows: (start + n) * g.rows]
        feed[n * g.rows:] = 0.0
        t0 = time.perf_counter()
        out = stage({INPUT: feed})
        calls.add(n, time.perf_counter() - t0)
        for name in names:
            parts[name].append(out[name][: n * g.tokens])
    return {n: np.concatenate(p) if len(p) > 1 else p[0] for n, p in parts.items()}


def _make_proxy_class() -> Any:
    torch, _ = _torch()
    from torch import nn

    class StageTower(nn.Module):
        """A vision tower that runs on a stage; see the module docstring.

        Args:
            original: the module it stands in for (kept, never called by ``forward``).
            stage: an opened ``xstage.Stage`` (anything called like one, with ``.artifact``).
            geometry: what the stage takes (``TowerGeometry``).
            deepstack: how many deepstack features the tower gives (0 for Qwen3.5).
        """

        def __init__(self, original: Any, stage: Any, geometry: TowerGeometry,
                     deepstack: int) -> None:
            super().__init__()
            self.stage = stage
            self.geometry = geometry
            self.deepstack = deepstack
            self.calls = _Calls()
            #: Rule 4's figures (relative L2 per output) when ``offload`` checked the stage.
            self.check_figures: dict[str, float] = {}
            # Not a submodule: the model's parameters stay the model's own while offloaded.
            object.__setattr__(self, "_original", original)
            self.config = original.config
            self.spatial_merge_size = original.spatial_merge_size
            self.patch_size = getattr(original, "patch_size", geometry.patch_size)
            family = sys.modules[type(original).__module__]
            self._output = (getattr(family, "BaseModelOutputWithDeepstackFeatures", None)
                            if deepstack else None)
            if self._output is None:
                from transformers.modeling_outputs import BaseModelOutputWithPooling

                self._output = BaseModelOutputWithPooling

        @property
        def original(self) -> Any:
            """The module this proxy stands in for."""
            return self._original

        @property
        def dtype(self) -> Any:
            """The tower's dtype: the model casts ``pixel_values`` to it."""
            return self._original.dtype

        @property
        def device(self) -> Any:
            """The tower's device (its outputs go to the device of ``pixel_values``)."""
            return self._original.device

        def check_grid(self, grid_thw: Any) -> list[list[int]]:
            """Rule 2: every image's grid is the stage's, or an ``InputError`` naming both."""
            return _check_grids(self.geometry, grid_thw)

        def forward(self, hidden_states: Any, grid_thw: Any = None, **kwargs: Any) -> Any:
            """``pixel_values`` [sum of patches, patch_dim] and ``grid_thw`` → the tower's outputs."""
            if grid_thw is None:
                raise errors.UsageError("the vision tower was called without grid_thw")
            g = self.geometry
            images = len(self.check_grid(grid_thw))
            if tuple(hidden_states.shape) != (images * g.rows, g.patch_dim):
                raise errors.InputError(
                    f"pixel_values has shape {list(hidden_states.shape)}; {images} image(s) of "
                    f"{g.describe(g.grid)} are [{images * g.rows}, {g.patch_dim}]")
            patches = hidden_states.detach().to("cpu", torch.float32).numpy()
            names = [EMBEDS] + [DEEPSTACK.format(i) for i in range(self.deepstack)]
            arrays = _run_batches(self.stage, g, patches, images, names, self.calls)
            dtype, device = self._original.dtype, hidden_states.device
            out = {n: torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)
                   for n, a in arrays.items()}
            if self.deepstack:
                return self._output(pooler_output=out[EMBEDS],
                                    deepstack_features=[out[n] for n in names[1:]])
            return self._output(pooler_output=out[EMBEDS])

    return StageTower


_PROXY: Any = None


def stage_tower_class() -> Any:
    """The ``StageTower`` class (an ``nn.Module``; built on first use: torch is optional).

    Raises:
        UsageError: torch or transformers is not importable here.
    """
    global _PROXY
    if _PROXY is None:
        _PROXY = _make_proxy_class()
    return _PROXY


def find_module(model: Any, path: str) -> tuple[str, Any]:
    """``(dotted name, module)`` for ``path``, a submodule name or its last part.

    An exact submodule name wins; otherwise the one module whose name ends with ``.<path>``
    (``"visual"`` finds ``model.visual``).

    Raises:
        UsageError: no module, or more than one, answers to ``path``.
    """
    names = dict(model.named_modules())
    if path in names and path:
        return path, names[path]
    found = sorted(n for n in names if n.endswith("." + path))
    if len(found) == 1:
        return found[0], names[found[0]]
    if found:
        raise errors.UsageError(f"{path!r} names {len(found)} modules: {', '.join(found)}",
                                remedy="give the full dotted name of one")
    top = ", ".join(n for n, _ in model.named_children())
    raise errors.UsageError(f"{type(model).__name__} has no module {path!r} (its children: {top})",
                            remedy="name the vision tower, for example 'visual' or 'model.visual'")


def _rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    den = float(np.linalg.norm(ref.astype(np.float64)))
    num = float(np.linalg.norm(got.astype(np.float64) - ref.astype(np.float64)))
    return num / den if den else num


def _check_against_module(proxy: Any, original: Any, tolerance: float) -> dict[str, float]:
    """Rule 4: the stage and the module on the stage's own admitted patches, output by output."""
    torch, _ = _torch()
    g = proxy.geometry
    inputs = getattr(proxy.stage, "inputs", None) or {}
    patches = inputs.get(INPUT)
    if patches is None:
        return {}
    grid = torch.tensor([list(g.grid)] * g.images, dtype=torch.long)
    x = torch.from_numpy(np.array(patches, np.float32))
    with torch.no_grad():
        ref = original(x.to(original.dtype), grid_thw=grid)
    got = proxy.stage({INPUT: np.asarray(patches, np.float32)})
    want = {EMBEDS: ref.pooler_output}
    for i, feat in enumerate(getattr(ref, "deepstack_features", None) or []):
        want[DEEPSTACK.format(i)] = feat
    figures = {name: _rel_l2(got[name], t.detach().float().cpu().numpy()) for name, t in want.items()}
    worst = max(figures, key=lambda n: figures[n])
    if figures[worst] > tolerance:
        raise errors.ArtifactError(
            f"the stage {proxy.stage.artifact.path.name} does not compute this model's tower: "
            f"{worst} differs by relative L2 {figures[worst]:.3g} (allowed {tolerance:g}) on the "
            "stage's own inputs", remedy="export the tower from this model's weights "
            "(xstage export vision-tower --checkpoint DIR), or pass check=False")
    return figures


def _deepstack_count(original: Any) -> int:
    return len(getattr(original, "deepstack_visual_indexes", None) or [])


@contextlib.contextmanager
def offload(model: Any, path: str, stage: Stage | Any, *, image_size: tuple[int, int] | None = None,
            check: bool = True, check_tolerance: float | None = None) -> Iterator[Any]:
    """Run ``model``'s module at ``path`` on ``stage`` inside the block; see the module doc.

    Args:
        model: a transformers model (``Qwen3VLForConditionalGeneration``,
            ``Qwen3_5ForConditionalGeneration``, or its inner model).
        path: the tower's module name, or its last part (``"visual"``).
        stage: an opened ``xstage.Stage`` holding the tower (``xstage export vision-tower``).
        image_size: ``(H, W)`` in pixels, for a stage whose manifest does not say (rule 1).
        check: run the stage and the module once on the stage's inputs and compare (rule 4).
        check_tolerance: the relative L2 the check allows, per output (default: by the
            tower's dtype, ``CHECK_TOLERANCE``).

    Yields:
        The ``StageTower`` proxy (its ``calls`` hold each stage call's images and seconds).

    Raises:
        UsageError: ``path`` names no module or several, or a module already offloaded, or the
            stage does not take patches of this tower's width (rules 1, 4, 5).
        ArtifactError: the stage's outputs do not match the tower's (rule 4).
        InputError: inside the block, an image whose grid is not the stage's (rule 2).
    """
    name, original = find_module(model, path)
    cls = stage_tower_class()
    if isinstance(original, cls):
        raise errors.UsageError(f"{name} is already offloaded to a stage",
                                remedy="leave the first offload block before opening another")
    geometry = _geometry(stage, original.config, image_size)
    deepstack = _deepstack_count(original)
    outputs = {s.name: s for s in stage.artifact.outputs}
    wanted = [EMBEDS] + [DEEPSTACK.format(i) for i in range(deepstack)]
    missing = [n for n in wanted if n not in outputs]
    if missing:
        raise errors.UsageError(
            f"the tower {name} gives {len(wanted)} outputs ({', '.join(wanted)}); the stage "
            f"{stage.artifact.path.name} lacks {', '.join(missing)}",
            remedy="export the tower of this model's family (--family qwen3_vl for deepstack)")
    width = int(original.config.out_hidden_size)
    if tuple(outputs[EMBEDS].shape) != (geometry.images * geometry.tokens, width):
        raise errors.UsageError(
            f"the stage's embeds are {list(outputs[EMBEDS].shape)}; this tower gives "
            f"[{geometry.images * geometry.tokens}, {width}] for {geometry.images} image(s)",
            remedy="export the tower of this model (same output width)")
    proxy = cls(original, stage, geometry, deepstack)
    if check:
        if check_tolerance is None:
            check_tolerance = CHECK_TOLERANCE.get(str(original.dtype).replace("torch.", ""), 5e-2)
        proxy.check_figures = _check_against_module(proxy, original, check_tolerance)
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, leaf, proxy)
    try:
        yield proxy
    finally:
        setattr(parent, leaf, original)
