"""Loading and validating bundles: every way a bundle can be broken names the file and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgespec.errors import BundleError, ChecksumError, MissingFileError, SchemaVersionError
from edgespec.manifest import MANIFEST_NAME, Manifest, load_bundle

from support.fake_bundle import make_bundle


def _edit_manifest(root: Path, **changes: object) -> None:
    path = root / MANIFEST_NAME
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_valid_bundle_loads_and_round_trips(tmp_path: Path) -> None:
    bundle = load_bundle(make_bundle(tmp_path / "b"))
    assert bundle.graph_path == tmp_path / "b" / "model.onnx"
    assert bundle.manifest.memory.kv_bytes(10) == 5120
    again = Manifest.from_dict(json.loads(bundle.manifest.to_json()))
    assert again == bundle.manifest
    assert isinstance(again.graph.inputs[0].shape, tuple)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="does not exist"):
        load_bundle(tmp_path / "absent")


def test_directory_without_manifest(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError, match=r"not an edgespec bundle.*edgespec export"):
        load_bundle(tmp_path)


def test_newer_schema_version_asks_for_an_upgrade(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b")
    _edit_manifest(root, schema_version=99)
    with pytest.raises(SchemaVersionError, match=r"newer than the 1.*upgrade edgespec"):
        load_bundle(root)


@pytest.mark.parametrize("version", [0, "1", None])
def test_unknown_schema_version_asks_for_a_re_export(tmp_path: Path, version: object) -> None:
    root = make_bundle(tmp_path / "b")
    _edit_manifest(root, schema_version=version)
    with pytest.raises(SchemaVersionError, match=r"unknown schema version.*re-export"):
        load_bundle(root)


def test_missing_file_is_named(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b")
    (root / "model.onnx").unlink()
    with pytest.raises(MissingFileError, match=r"model\.onnx is missing"):
        load_bundle(root)


def test_truncated_graph(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b")
    graph = root / "model.onnx"
    graph.write_bytes(graph.read_bytes()[:50])
    with pytest.raises(ChecksumError, match=r"model\.onnx is truncated \(50 of 67 bytes\)"):
        load_bundle(root)


def test_modified_file_fails_its_checksum(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b")
    graph = root / "model.onnx"
    data = bytearray(graph.read_bytes())
    data[0] ^= 0xFF
    graph.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="does not match its sha256"):
        load_bundle(root)
    assert load_bundle(root, verify_checksums=False).manifest.files[0].path == "model.onnx"


def test_invalid_json(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b")
    (root / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        load_bundle(root)


def test_missing_field_is_named(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b")
    data = json.loads((root / MANIFEST_NAME).read_text())
    del data["graph"]["past_key"]
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"missing field 'manifest\.graph\.past_key'"):
        load_bundle(root)


def test_wrong_type_is_named(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b")
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["model"]["num_layers"] = "two"
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"'manifest\.model\.num_layers' must be an integer"):
        load_bundle(root)


def test_graph_not_listed_among_files(tmp_path: Path) -> None:
    root = make_bundle(tmp_path / "b")
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["files"] = [f for f in data["files"] if f["path"] != "model.onnx"]
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"does not list model\.onnx"):
        load_bundle(root)


def test_a_file_is_judged_a_gguf_by_its_magic_not_its_name(tmp_path: Path) -> None:
    named = tmp_path / "README.gguf"
    named.write_text("# not a model\n")
    with pytest.raises(BundleError, match="is neither a bundle directory nor a GGUF file"):
        load_bundle(named)
    real = tmp_path / "model.bin"
    real.write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(BundleError, match="is a GGUF file, not a bundle directory"):
        load_bundle(real)
