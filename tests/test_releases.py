"""The release table's checks of installed tool versions."""

from __future__ import annotations

import pytest

from build_models.releases import DEFAULT_RELEASE, ReleaseMismatchError, check_pytorch, main


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
