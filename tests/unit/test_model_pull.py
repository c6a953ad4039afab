"""``modelstore.pull``: a version reaches the cache whole and verified, or not at all."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from modelstore.checksum import folder_checksum
from modelstore.pull import PullError, pull, read_record


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    folder = tmp_path / "store" / "m" / "v1"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"layers": 2}')
    (folder / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 4096)
    return folder


def quiet(_: str) -> None:
    pass


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "m").iterdir() if p.name not in ("v1", ".v1.pull.json"))


def test_a_pull_copies_verifies_and_a_second_pull_only_verifies(artifact, tmp_path):
    cache, checksum = tmp_path / "cache", folder_checksum(artifact)
    first = pull(str(artifact), model="m", version="v1", checksum=checksum, cache=cache,
                 progress=quiet)  # fmt: skip
    assert first.path == cache / "m" / "v1" and not first.cached
    assert first.bytes_copied == sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
    assert folder_checksum(first.path) == checksum
    assert read_record(first.path)["bytes_copied"] == first.bytes_copied

    second = pull(str(artifact), model="m", version="v1", checksum=checksum, cache=cache,
                  progress=quiet)  # fmt: skip
    assert second.cached and second.bytes_copied == 0
    assert read_record(second.path)["cached"] is True  # the agent reports this pod's pull
    assert leftovers(cache) == []


def test_a_checksum_mismatch_fails_and_leaves_nothing(artifact, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(PullError, match="checksum"):
        pull(str(artifact), model="m", version="v1", checksum="sha256:" + "0" * 64,
             cache=cache, progress=quiet)  # fmt: skip
    assert not (cache / "m" / "v1").exists()
    assert leftovers(cache) == []


def test_a_rotten_cached_copy_is_pulled_again(artifact, tmp_path):
    cache, checksum = tmp_path / "cache", folder_checksum(artifact)
    pulled = pull(str(artifact), model="m", version="v1", checksum=checksum, cache=cache,
                  progress=quiet)  # fmt: skip
    (pulled.path / "config.json").write_text('{"layers": 3}')  # a byte flipped on disk

    again = pull(str(artifact), model="m", version="v1", checksum=checksum, cache=cache,
                 progress=quiet)  # fmt: skip
    assert not again.cached and folder_checksum(again.path) == checksum


def test_two_pods_pulling_at_once_both_end_with_one_verified_copy(artifact, tmp_path):
    cache, checksum = tmp_path / "cache", folder_checksum(artifact)
    results, errors = [], []

    def one() -> None:
        try:
            results.append(pull(str(artifact), model="m", version="v1", checksum=checksum,
                                cache=cache, progress=quiet))  # fmt: skip
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and len(results) == 2
    assert folder_checksum(cache / "m" / "v1") == checksum
    assert leftovers(cache) == []


@pytest.mark.parametrize("source", ["s3://bucket/m/v1", "/no/such/folder"])
def test_an_unreadable_source_is_a_clear_error(source, tmp_path):
    with pytest.raises(PullError, match=r"s3:// stores are not readable yet|no such artifact"):
        pull(source, model="m", version="v1", checksum="sha256:x", cache=tmp_path,
             progress=quiet)  # fmt: skip
