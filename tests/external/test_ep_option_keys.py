"""``xstage external --ep-option`` with a key the route does not take: exit 64 before any worker,
one line naming the key and the keys the route takes, no traceback, no record."""

from __future__ import annotations


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_key_the_cpu_ep_would_ignore_is_a_usage_error(external, xstage_home):
    """Before: onnxruntime's CPU EP took ``num_of_threads=1`` silently, and the run said placed."""
    r = external("--builtin", "vision-tower-tiny", "--route", "ort-cpu", "--ep-option", "num_of_threads=1")
    assert r.code == 64 and r.record is None, r.stderr
    assert _error_lines(r.stderr) == ["error: --ep-option num_of_threads: route ort-cpu has no such option"]
    assert 'hint: options taken: ort-cpu: none (docs/routes.md, "EP options")' in r.stderr
    assert "Traceback" not in r.stderr and not (xstage_home / "logs").exists()


def test_an_openvino_key_that_does_not_exist_is_a_usage_error(external, openvino_python):
    """Before: the worker raised "Invalid OpenVINO EP option: bogus" and the run exited 1."""
    r = external("--builtin", "vision-tower-tiny", "--route", "ort-openvino", "--ep-option", "bogus=1",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 64 and r.record is None, r.stderr
    assert _error_lines(r.stderr) == ["error: --ep-option bogus: route ort-openvino has no such option"]
    assert "ort-openvino: cache_dir, context, device_id," in r.stderr and "Traceback" not in r.stderr


def test_the_offload_names_every_route_it_would_try(external, openvino_python):
    r = external("--builtin", "vision-tower-tiny", "--ep-option", "bogus=1",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 64 and r.record is None, r.stderr
    assert _error_lines(r.stderr) == [
        "error: --ep-option bogus: no route of this run (ort-openvino, ort-cpu) takes it"]
    assert "; ort-cpu: none" in r.stderr


def test_a_key_the_offloaded_route_takes_runs(external, openvino_python):
    r = external("--builtin", "vision-tower-tiny", "--ep-option", "num_of_threads=1",
                 env={"XSTAGE_PYTHON_ORT_OPENVINO": str(openvino_python)})
    assert r.code == 0, r.stderr
    assert r.record["request"]["ep_options"] == {"num_of_threads": "1"}
