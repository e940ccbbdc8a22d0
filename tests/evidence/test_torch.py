"""Judging a torch warm-up's op log (pure): views neutral, copies apart, CPU work caught."""

from __future__ import annotations

import pytest

from xstage.evidence.torch import prove_torch


def _op(op, ins, outs, n=1):
    return {"op": op, "in": ins, "out": outs, "count": n}


GPU = ["cuda:0"]
CPU = ["cpu"]


def test_all_on_the_device_is_placed_views_and_copies_apart():
    ops = [_op("mm", GPU, GPU, 10), _op("view", GPU, GPU, 30), _op("_to_copy", CPU, GPU, 2),
           _op("_assert_tensor_metadata", GPU, [], 5), _op("add", GPU, GPU, 4)]
    proof = prove_torch(ops=ops, output_devices=["cuda:0"], target_device="cuda:0",
                        min_placement=0.999)
    assert proof.verdict == "placed" and proof.fraction == 1.0
    assert (proof.nodes_on_target, proof.nodes_total, proof.copies) == (14, 14, 2)
    assert proof.target_ep == "torch:cuda" and proof.basis == "execution"
    assert proof.cpu_nodes == {}


def test_a_round_trip_through_the_cpu_is_a_split_named_by_op():
    ops = [_op("mm", GPU, GPU, 9), _op("_to_copy", GPU, CPU), _op("sin", CPU, CPU),
           _op("_to_copy", CPU, GPU)]
    proof = prove_torch(ops=ops, output_devices=["cuda:0"], target_device="cuda",
                        min_placement=0.999)
    assert proof.verdict == "declined" and proof.cause == "declined"
    assert proof.fraction == 0.9 and proof.copies == 2
    assert proof.cpu_nodes == {"sin": ("sin×1 on cpu",)}
    assert prove_torch(ops=ops, output_devices=["cuda:0"], target_device="cuda",
                       min_placement=0.5).verdict == "placed"


def test_outputs_off_the_device_decline_whatever_the_fraction():
    proof = prove_torch(ops=[_op("mm", GPU, GPU)], output_devices=["cpu"], target_device="cuda",
                        min_placement=0.5)
    assert proof.verdict == "declined" and any("outputs came back" in n for n in proof.notes)


def test_no_log_is_unmeasured_never_placed():
    proof = prove_torch(ops=[], output_devices=None, target_device="cpu")
    assert proof.verdict == "unmeasured" and proof.cause == "unmeasured"


def test_cpu_target_counts_cpu_ops_as_on_target():
    proof = prove_torch(ops=[_op("mm", CPU, CPU, 3)], output_devices=["cpu"], target_device="cpu",
                        min_placement=0.999)
    assert proof.verdict == "placed" and proof.target_ep == "torch:cpu"


def test_directml_adapter_is_chosen_by_name_never_index_0():
    import pytest

    from xstage_remote.torch_runtime import pick_adapter

    names = ["NVIDIA GeForce RTX 4060 Laptop GPU", "AMD Radeon(TM) 890M Graphics"]
    assert pick_adapter(names, "AMD Radeon(TM) 890M  graphics") == 1
    with pytest.raises(RuntimeError, match="no match"):
        pick_adapter(names, "Intel Arc")
    with pytest.raises(RuntimeError, match="no match"):
        pick_adapter(names, None)  # no name: never a silent adapter 0
    with pytest.raises(RuntimeError, match="2 matches"):
        pick_adapter(["AMD Radeon", "AMD Radeon"], "AMD Radeon")


def _timed(op, ins, outs, n=1, us=10.0):
    return {"op": op, "in": ins, "out": outs, "count": n, "time_us": us}


def test_higher_order_ops_are_control_flow_their_inner_ops_count():
    ops = [_timed("hop:cond", CPU, CPU), _timed("sin", CPU, CPU, 2), _timed("gt", CPU, CPU)]
    proof = prove_torch(ops=ops, output_devices=["cpu"], target_device="cpu")
    assert proof.verdict == "placed" and (proof.nodes_on_target, proof.nodes_total) == (3, 3)
    assert proof.control_flow_kernels == 1 and any("cond×1" in n for n in proof.notes)


def test_nothing_counted_is_unmeasured_not_declined():
    ops = [_timed("view", CPU, CPU), _timed("hop:while_loop", CPU, CPU)]
    proof = prove_torch(ops=ops, output_devices=["cpu"], target_device="cpu")
    assert (proof.verdict, proof.cause, proof.fraction) == ("unmeasured", "unmeasured", None)


def test_outputs_off_the_device_have_their_own_cause():
    proof = prove_torch(ops=[_timed("mm", GPU, GPU)], output_devices=["cpu"],
                        target_device="cuda")
    assert (proof.verdict, proof.cause) == ("declined", "outputs_off_device")


def test_the_time_fraction_declines_a_stage_whose_work_is_on_the_cpu():
    """31 of 32 ops on the device, 98% of the time on the CPU: declined at 0.9."""
    ops = [_timed("add", GPU, GPU, 31, us=31.0), _timed("mm", CPU, CPU, 1, us=2000.0)]
    kernels = {"device_kernels": 31, "device_time_us": 40.0}
    proof = prove_torch(ops=ops, output_devices=["cuda:0"], target_device="cuda",
                        min_placement=0.9, kernels=kernels)
    assert proof.node_fraction == pytest.approx(31 / 32)
    assert proof.time_fraction == pytest.approx(40 / 2040)
    assert (proof.verdict, proof.cause) == ("declined", "declined")
    assert proof.fraction == proof.time_fraction
