import multiprocessing
import os

import pytest

from schemas import storage
from schemas.errors import StorageError


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path):
    target = tmp_path / "m.json"
    storage.atomic_write(str(target), b"one")
    storage.atomic_write(str(target), b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["m.json"]


def test_create_exclusive_never_overwrites(tmp_path):
    target = str(tmp_path / "metadata.final")
    assert storage.create_exclusive(target, b"first") is True
    assert storage.create_exclusive(target, b"second") is False
    assert (tmp_path / "metadata.final").read_bytes() == b"first"
    assert os.listdir(tmp_path) == ["metadata.final"]


def _try_create(args):
    path, token = args
    return token if storage.create_exclusive(path, token.encode()) else None


def test_create_exclusive_has_one_winner_across_processes(tmp_path):
    target = str(tmp_path / "metadata.final")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(_try_create, [(target, f"writer-{i}") for i in range(16)])
    winners = [r for r in results if r]
    assert len(winners) == 1
    assert (tmp_path / "metadata.final").read_text() == winners[0]


def test_list_dir_skips_temp_names(tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    (tmp_path / ".tmp-123-a").write_bytes(b"y")
    assert [e.name for e in storage.list_dir(str(tmp_path))] == ["a"]
    assert [e.name for e in storage.list_dir(str(tmp_path), include_temp=True)] == [".tmp-123-a", "a"]
    assert storage.list_dir(str(tmp_path / "missing")) == []


def test_a_scheme_without_a_store_is_refused_naming_the_supported_ones():
    with pytest.raises(StorageError, match=r"no store for hdfs://.*local paths, file://, gs://, s3://"):
        storage.check_output_root("hdfs://namenode/snapshots")


def test_an_output_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "root").write_text("x")
    with pytest.raises(StorageError, match="is a file, not a folder"):
        storage.check_output_root(str(tmp_path / "root"))


def test_unwritable_directory_is_a_storage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="cannot create directory"):
        storage.make_dirs(str(blocker / "sub"))


def test_output_root_is_created_and_probed(tmp_path):
    storage.check_output_root(str(tmp_path / "new" / "root"))
    assert os.listdir(tmp_path / "new" / "root") == []
