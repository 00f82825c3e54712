"""The model identity the plugins key by (kvtier/_identity.py): one
checkpoint at two paths is one identity, two checkpoints of the same shapes
are two, whatever they are named."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from kvtier._identity import serving_identity, weights_fingerprint

from conftest import checkpoint


def test_one_checkpoint_at_two_paths_is_one_identity(tmp_path: Path) -> None:
    a = checkpoint(tmp_path / "a", 1)
    b = tmp_path / "elsewhere" / "b"
    shutil.copytree(a, b)
    assert weights_fingerprint(a) == weights_fingerprint(b) is not None
    assert serving_identity(str(a)) == serving_identity(str(b))


def test_two_checkpoints_of_one_shape_are_two(tmp_path: Path) -> None:
    a = checkpoint(tmp_path / "a", 1)
    b = checkpoint(tmp_path / "b", 2)
    assert os.path.getsize(a / "model.safetensors") == os.path.getsize(b / "model.safetensors")
    assert weights_fingerprint(a) != weights_fingerprint(b)
    # One byte changed where a sample falls (the first slice).
    c = tmp_path / "c"
    shutil.copytree(a, c)
    with open(c / "model.safetensors", "r+b") as f:
        f.seek(0)
        f.write(b"\xff")
    assert weights_fingerprint(a) != weights_fingerprint(c)
    assert weights_fingerprint(a, "full") != weights_fingerprint(c, "full")


def test_a_name_alone_is_its_own_identity(tmp_path: Path) -> None:
    assert serving_identity("org/model") == serving_identity("org/model") != serving_identity("org/other")
    assert weights_fingerprint(tmp_path) is None
