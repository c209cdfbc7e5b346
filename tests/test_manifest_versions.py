"""attnserve.json's format versions: an export writes version 2, which names its KV cache layout
always; a version-1 directory (exported before the arena, its layout left out for concat) still loads
as concat; a version-2 manifest without its layout, or an unknown version, is
refused naming what is wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fixtures_server import start_server

from attnserve.core.loading import StartupError
from attnserve.runtime import contract
from attnserve.runtime.contract import ModelDirError
from attnserve.runtime.ort_decoder import OrtDecoder


def rewritten(model_dir: Path, tmp_path: Path, **changes) -> Path:
    """A copy of `model_dir` whose manifest has `changes` (a value of None removes the key)."""
    copy = tmp_path / model_dir.name
    shutil.copytree(model_dir, copy)
    path = copy / contract.MANIFEST_FILE
    raw = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    path.write_text(json.dumps(raw))
    return copy


def test_an_export_writes_version_2_with_its_kv_cache_named(tiny_model_dir, tiny_concat_model_dir):
    for model_dir, layout in ((tiny_model_dir, "arena"), (tiny_concat_model_dir, "concat")):
        raw = json.loads((model_dir / contract.MANIFEST_FILE).read_text())
        assert raw["format_version"] == 2 and raw["kv_cache"] == layout


def test_a_version_1_directory_without_its_layout_loads_as_concat_and_decodes_the_same_tokens(
    tiny_concat_model_dir, tmp_path
):
    """Read as the concat layout, as before version 2: its graph decodes what the version-2 copy does
    (ONNX Runtime's greedy loop, the export gate's), and the server refuses it as it refuses any
    concat directory, by its layout."""
    old = rewritten(tiny_concat_model_dir, tmp_path, format_version=1, kv_cache=None)
    assert contract.read_manifest(old).kv_cache == contract.KV_CONCAT
    prompts = [[1, 40, 41, 42], [1, 50]]
    assert (OrtDecoder(old).greedy(prompts, 12) == OrtDecoder(tiny_concat_model_dir).greedy(prompts, 12)).all()
    with pytest.raises(StartupError, match="was exported with the concat KV cache"):
        start_server(old)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"kv_cache": None}, "is malformed (KeyError: 'kv_cache')"),
        ({"format_version": 3}, "format_version 3, expected 1 or 2"),
        ({"format_version": None}, "format_version None, expected 1 or 2"),
    ],
)
def test_a_manifest_without_its_layout_or_of_an_unknown_version_is_refused(tiny_model_dir, tmp_path, changes, said):
    with pytest.raises(ModelDirError) as refused:
        contract.read_manifest(rewritten(tiny_model_dir, tmp_path, **changes), verify=False)
    assert said in str(refused.value)
