"""A missing extra is one line naming it; an installed module that fails to import is not taken for a missing one."""

import pytest

from schemas import extras
from schemas.errors import UsageError


def test_a_missing_module_is_one_line_naming_its_extra(monkeypatch):
    monkeypatch.setitem(extras.EXTRA_OF, "snapfeed_absent_framework", ("torch", "PyTorch"))
    with pytest.raises(UsageError) as refused:
        extras.require("snapfeed_absent_framework", "output='torch'")
    assert str(refused.value) == (
        "output='torch' needs PyTorch, which is not installed here: pip install 'snapfeed[torch]'"
    )


def test_a_missing_parent_package_is_a_missing_module(monkeypatch):
    monkeypatch.setitem(extras.EXTRA_OF, "snapfeed_absent.cloud.storage", ("gcs", "google-cloud-storage"))
    assert "snapfeed[gcs]" in str(extras.missing("snapfeed_absent.cloud.storage", "a gs:// path"))


def test_an_installed_module_that_fails_to_import_raises_its_own_error(monkeypatch, tmp_path):
    (tmp_path / "snapfeed_broken_framework.py").write_text("raise ImportError('libcuda.so.1: cannot open')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(extras.EXTRA_OF, "snapfeed_broken_framework", ("torch", "PyTorch"))
    with pytest.raises(ImportError, match="libcuda"):
        extras.require("snapfeed_broken_framework", "output='torch'")


def test_an_installed_module_is_returned():
    assert extras.require("torch", "output='torch'").__name__ == "torch"
