"""``xstage export --for-torch 2.4``: today's program in the archive and schema torch 2.4 reads.

The projection is tested as a function; the export runs in the export venv (torch 2.13). That
torch 2.4.1 loads and runs the result is tests/routes/test_torch241.py (needs its wheels).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import runcache

from xstage.export import _torch_schema_5_3 as schema
from xstage.export.pt2_legacy import LegacySchemaError, project
from xstage.manifest import manifest_path


def _node(**extra):
    node = {"target": "torch.ops.aten.add.Tensor",
            "inputs": [{"name": "self", "arg": {"as_tensor": {"name": "x"}}, "kind": 1},
                       {"name": "alpha", "arg": {"as_none": True}, "kind": 2}],
            "outputs": [{"as_tensor": {"name": "y"}}], "metadata": {}, "name": "add",
            "is_hop_single_tensor_return": None}
    node.update(extra)
    return node


def test_informational_fields_are_dropped_and_as_none_becomes_the_empty_tuple():
    dropped: dict[str, int] = {}
    out = project(_node(), "Node", schema.TYPES, dropped)
    assert set(out) == {"target", "inputs", "outputs", "metadata"}
    assert out["inputs"][0] == {"name": "self", "arg": {"as_tensor": {"name": "x"}}}
    assert out["inputs"][1]["arg"] == {"as_none": []}
    assert dropped == {"Node.is_hop_single_tensor_return": 1}  # None: its default


def test_a_new_field_holding_a_value_is_refused_by_name():
    with pytest.raises(LegacySchemaError, match="Node.is_hop_single_tensor_return"):
        project(_node(is_hop_single_tensor_return=True), "Node", schema.TYPES, {})


def test_a_union_variant_the_old_schema_lacks_is_refused():
    arg = {"name": "other", "arg": {"as_sym_float": {"as_name": "s0"}}, "kind": 1}
    with pytest.raises(LegacySchemaError, match="Argument.as_sym_float does not exist"):
        project(_node(inputs=[arg]), "Node", schema.TYPES, {})


def test_an_enum_value_the_old_schema_lacks_is_refused():
    meta = {"dtype": 29, "sizes": [], "requires_grad": False, "device": {"type": "cpu"},
            "strides": [], "storage_offset": {"as_int": 0}, "layout": 7}  # 29: float8_e4m3fn
    with pytest.raises(LegacySchemaError, match="ScalarType value 29"):
        project(meta, "TensorMeta", schema.TYPES, {})


def test_the_table_is_torch_2_4_1s_schema():
    assert schema.SCHEMA_VERSION == (5, 3)
    assert "dialect" in schema.TYPES["ExportedProgram"][1]
    assert schema.TYPES["Argument"][1]["as_none"] == ("Tuple[()]", False)


def _export(python, out, *extra):
    return subprocess.run([str(python), "-m", "xstage", "export", "vision-tower", "--config", "tiny",
                           "--format", "pt:fp32", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def legacy_tower(export_python, tmp_path_factory):
    """The legacy export, kept in the test cache while its code and inputs are unchanged
    (tests/runcache.py: a change to the exporter runs it again)."""
    out = tmp_path_factory.mktemp("legacy") / "tower"
    done = runcache.run(export_python, ["-m", "xstage", "export", "vision-tower", "--config", "tiny",
                                        "--format", "pt:fp32", "--out", "{out}/tower", "--for-torch", "2.4",
                                        "--json", "{out}/tower.json"], out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "for torch 2.4: schema 5.3" in done.stdout
    return out.with_suffix(".pt2")


def test_the_export_writes_the_flat_archive_and_says_so_in_the_manifest(legacy_tower):
    with zipfile.ZipFile(legacy_tower) as z:
        assert sorted(z.namelist()) == ["serialized_constants.pt", "serialized_example_inputs.pt",
                                        "serialized_exported_program.json", "serialized_state_dict.pt",
                                        "version"]
        assert z.read("version") == b"5.3"
        doc = json.loads(z.read("serialized_exported_program.json"))
    assert doc["schema_version"] == {"major": 5, "minor": 3} and doc["dialect"] == "ATEN"
    assert "verifiers" not in doc and "torch_version" not in doc
    manifest = json.loads(manifest_path(legacy_tower).read_text())
    assert manifest["exporter"]["pt2_for_torch"] == "2.4" and manifest["exporter"]["pt2_schema"] == "5.3"
    report = json.loads(Path(str(legacy_tower.with_suffix("")) + ".json").read_text())[0]
    assert report["legacy"]["roundtrip_bitwise"] is True
    assert report["legacy"]["dialect_exported"] == "TRAINING"


def test_todays_torch_refuses_the_flat_archive_naming_it(export_python, legacy_tower, tmp_path):
    env = dict(os.environ, XSTAGE_PYTHON_TORCH_CPU=str(export_python), COLUMNS="120")
    done = subprocess.run([sys.executable, "-m", "xstage", "external", "--graph", str(legacy_tower),
                           "--route", "torch-cpu"], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    said = " ".join(done.stderr.split())  # the terminal width may break a line anywhere
    assert "flat archive torch 2.4 reads" in said and "--for-torch 2.4" in said


def test_for_torch_on_an_onnx_format_is_a_usage_error(export_python, tmp_path):
    done = subprocess.run([str(export_python), "-m", "xstage", "export", "vision-tower", "--config",
                           "tiny", "--format", "onnx:fp32", "--for-torch", "2.4", "--out",
                           str(tmp_path / "t")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 64 and "--for-torch applies to a .pt2" in done.stderr
