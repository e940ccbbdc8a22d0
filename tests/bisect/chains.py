"""Seeded chains for the live bisect tests: unary ops the OpenVINO EP takes, and ones it declines.

Measured on this VM (onnxruntime-openvino 1.24.1, CPU), one op alone and inside a Sin→op→Tanh
chain (``tests/fixtures/bisect/README.md`` has the script's table): ``Hardmax``, ``Det`` and
``IsNaN`` are left on the CPU alone and in a chain (the EP has no kernel for them); ``Celu`` is
left on the CPU alone but taken inside a chain; ``Round``, ``Erf``, ``Mish``, ``Softplus``,
``Sin``… are taken everywhere.
"""

from __future__ import annotations

import random

import onnx
from onnx import TensorProto, helper

#: Unary float ops the OpenVINO EP takes, alone and in a chain (measured).
TAKEN = ("Sin", "Tanh", "Neg", "Sigmoid", "Abs", "Cos")
#: A unary float op with no OpenVINO kernel: left on the CPU alone and in a chain (measured).
DECLINED = "Hardmax"


def seeded(seed: int, n: int, k: int) -> list[int]:
    """``k`` positions of ``n``, drawn from ``seed`` (printed by the tests, to reproduce)."""
    return sorted(random.Random(seed).sample(range(n), k))


def chain(n: int, declined: list[int], *, op: str = DECLINED, shape: tuple[int, ...] = (4, 8),
          opset: int = 17) -> onnx.ModelProto:
    """A chain of ``n`` unary nodes, ``op`` at the ``declined`` positions, named ``n<i>_<op>``."""
    nodes, prev = [], "x"
    for i in range(n):
        kind = op if i in declined else TAKEN[i % len(TAKEN)]
        out = "y" if i == n - 1 else f"v{i}"
        nodes.append(helper.make_node(kind, [prev], [out], name=f"n{i}_{kind}"))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
