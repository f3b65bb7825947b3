"""The release table's checks of installed tool versions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from build_models.releases import (
    DEFAULT_RELEASE,
    ReleaseMismatchError,
    check_manifest,
    check_pytorch,
    main,
)


def test_ngc_prerelease_build_of_the_release_pytorch_is_accepted() -> None:
    # The version string torch reports inside nvcr.io/nvidia/pytorch:24.10-py3.
    assert check_pytorch("24.10", "2.5.0a0+e000cf0ad9").pytorch == "2.5.0"


@pytest.mark.parametrize("installed", ["2.13.0+cpu", "2.4.1", "3.5.0"])
def test_other_pytorch_releases_are_refused_with_the_image_to_use(installed: str) -> None:
    with pytest.raises(ReleaseMismatchError, match=r"nvcr\.io/nvidia/pytorch:24\.10-py3"):
        check_pytorch("24.10", installed)


def test_check_installed_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    # This environment has a CPU torch that is not the libtorch of any Triton release in the table.
    import torch

    if torch.__version__.startswith("2.5."):
        pytest.skip("this environment has the release's PyTorch")
    assert main(["--check-installed", DEFAULT_RELEASE]) == 2
    assert "PyTorch backend runs libtorch" in capsys.readouterr().err


def manifest_with(tmp_path: Path, torch: str, treelite: str = "4.3.0") -> Path:
    path = tmp_path / "pipelines" / "1" / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"triton_release": "24.10", "versions": {"torch": torch, "treelite": treelite}})
    )
    return path


def test_artifacts_of_the_release_pytorch_are_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = manifest_with(tmp_path, "2.5.0a0+e000cf0ad9")
    assert check_manifest(path).ngc_tag == "24.10"
    assert main(["--check-manifest", str(path)]) == 0
    assert "which Triton 24.10 loads" in capsys.readouterr().out
    # A repository: its highest pipeline version's manifest is the one checked.
    assert main(["--check-manifest", str(tmp_path)]) == 0


def test_artifacts_of_another_pytorch_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A development build: the CPU torch of these machines, which Triton 24.10's libtorch may not load.
    path = manifest_with(tmp_path, "2.13.0+cpu")
    assert main(["--check-manifest", str(path)]) == 2
    assert "torch 2.13.0+cpu is installed" in capsys.readouterr().err
    with pytest.raises(ReleaseMismatchError, match="Treelite"):
        check_manifest(manifest_with(tmp_path, "2.5.0", treelite="4.4.1"))


def test_a_missing_manifest_says_to_build_first(tmp_path: Path) -> None:
    with pytest.raises(ReleaseMismatchError, match="build the models first"):
        check_manifest(tmp_path / "pipelines" / "1" / "manifest.json")
    with pytest.raises(ReleaseMismatchError, match="build the models first"):
        check_manifest(tmp_path)
