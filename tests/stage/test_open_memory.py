"""Opening a large stage without needless copies in the client (docs/memory.md, "The client's
peak while opening"): synthesized inputs drawn block by block, shape inference without onnx's
per-element data propagation.

RSS is measured only where the gap is an order of magnitude (a fresh process, ``ru_maxrss``);
``benchmarks/open_rss.py`` measures the whole open.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
from onnx import TensorProto, helper

from xstage.artifact import IOSpec, graph_facts
from xstage.inputs import synthesize


def test_synthesized_inputs_are_the_same_numbers_drawn_in_blocks():
    """Every dtype, filled block by block: the values one whole draw gives, in order."""
    specs = [IOSpec("f", "float32", (3, 700_001)), IOSpec("h", "float16", (5,)),
             IOSpec("i", "int64", (1_200_000,)), IOSpec("b", "bool", (1_100_000,)),
             IOSpec("z", "float32", ()), IOSpec("e", "float32", (0, 4))]
    got = synthesize(specs, seed=7)
    rng = np.random.default_rng(7)
    want = {"f": rng.standard_normal((3, 700_001)).astype("float32"),
            "h": rng.standard_normal((5,)).astype("float16"),
            "i": rng.integers(0, 8, size=(1_200_000,)).astype("int64"),
            "b": rng.integers(0, 2, size=(1_100_000,)).astype(bool),
            "z": np.asarray(rng.standard_normal(()), dtype="float32"),
            "e": rng.standard_normal((0, 4)).astype("float32")}
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


GROWTH = textwrap.dedent("""
    import resource, sys
    from xstage import builtin_graphs
    from xstage.artifact import graph_facts
    n = 8 << 20
    path = builtin_graphs.write(builtin_graphs.slice_graph(n, n), sys.argv[1])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    facts = graph_facts(path, {})
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert facts.error is None and facts.outputs == ("y",), facts
    print((after - before) // 1024)
""")


def test_graph_facts_of_a_long_rank_one_input_stay_small(tmp_path):
    """A 32 MiB rank-1 input through a Slice: before, onnx's data propagation grew the process
    by about 1.2 GiB (about 150 bytes an element); now by little."""
    done = subprocess.run([sys.executable, "-c", GROWTH, str(tmp_path / "slice.onnx")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) < 200, done.stdout


def test_data_propagation_still_resolves_a_computed_shape(tmp_path):
    """``Reshape(x, Shape(x))``: only data propagation knows the output is (2, 3)."""
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])],
        "computed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "computed.onnx"
    onnx.save(model, str(path))
    facts = graph_facts(path, {})
    assert {v.name: v.shape for v in facts.values}["y"] == (2, 3)
