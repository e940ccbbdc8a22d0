"""Every slot set of the region answers the gate's inputs as set 0 does, checked in the worker.

The numeric gate's calls run at depth 1, in a region of one set; the stage then serves from a
region of ``depth`` sets, each with its own slots (and, on torch-cuda, its own pinned buffers and
copies). A set whose slots, binding or copies went wrong would answer wrongly with nothing to
see it. The client hands the gate's inputs over once, inline; the worker writes them into each
set, runs each set as a request would run there, and compares each set's outputs with set 0's
byte for byte. The client touches none of the sets' pages, so its peak while opening a stage is
what it was (docs/memory.md, "The client's peak while opening a stage"); only a set that
answers otherwise sends bytes back: its outputs and set 0's, for the client's verdict.

Python 3.9 syntax: this runs in the route's interpreter.
"""

import numpy as np

from .wire import SET0_PREFIX as SET0
from .wire import SETK_PREFIX as SETK

__all__ = ["check_sets"]

_CHUNK = 1 << 20  # bytes compared at a time: no temporary the size of an output


def _same_bytes(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    x = np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # 0-d: one element, 1-d here
    y = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    for start in range(0, x.size, _CHUNK):
        if not np.array_equal(x[start:start + _CHUNK], y[start:start + _CHUNK]):
            return False
    return True


def _answer(runtime, region, in_names, out_views, feeds, s):
    """Set ``s``'s answer to ``feeds``, computed as a request in that set is (``on_shm_call``)."""
    for name, value in feeds.items():
        if not value.flags.c_contiguous:  # (ascontiguousarray would make a 0-d input 1-d)
            value = value.copy(order="C")
        if not region.write("in", name, value, s):
            raise ValueError("check_sets: input %r does not fit its slot in set %d" % (name, s))
    views = out_views[s]
    rest = runtime.run_into(region.inputs(s, in_names), views, s)
    out = {}
    for o in runtime.outputs:
        name = o["name"]
        out[name] = rest[name] if name in rest else views[name]
    return out


def check_sets(runtime, region, in_names, out_views, feeds):
    """Run ``feeds`` in every set of ``region``; compare each set's outputs with set 0's.

    Returns ``(info, arrays)``: ``info`` says how many sets ran and the first that answered
    otherwise (``differs``, None when all agreed, bit for bit); ``arrays`` holds, for that set,
    set 0's outputs and its own (``wire.SET0_PREFIX``, ``wire.SETK_PREFIX`` before each name), else nothing.
    """
    first = _answer(runtime, region, in_names, out_views, feeds, 0)
    for s in range(1, region.n_sets):
        got = _answer(runtime, region, in_names, out_views, feeds, s)
        if all(_same_bytes(first[n], got[n]) for n in first):
            continue
        arrays = {}
        for name in first:
            arrays[SET0 + name] = np.array(first[name])
            arrays[SETK + name] = np.array(got[name])
        return {"sets": s + 1, "differs": s}, arrays
    return {"sets": region.n_sets, "differs": None}, {}
