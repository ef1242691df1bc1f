"""``python -m ops.flower_screenshot``: an existing picture is not overwritten without ``--force``."""

from __future__ import annotations

import pytest

from ops import flower_screenshot


def test_flower_screenshot_keeps_an_existing_picture(tmp_path, capsys):
    out = tmp_path / "flower.png"
    out.write_bytes(b"a picture someone keeps")
    with pytest.raises(SystemExit) as info:
        flower_screenshot.main(["--out", str(out)])
    assert info.value.code == 2
    assert "exists (give --force to overwrite it)" in capsys.readouterr().err
    assert out.read_bytes() == b"a picture someone keeps"
