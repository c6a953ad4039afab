"""``pdserve model pull`` as the pods' init container runs it: the artifact and checksum
come from a real router's model registry, read with a viewer token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from modelstore.checksum import folder_checksum
from tests.router.conftest import TEST_ROUTER, running_router

VIEWER = "pull-viewer"


def pull(router_url: str, cache: Path, *extra: str, token: str = VIEWER):
    env = {**os.environ, "PDSERVE_VIEWER_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "model", "pull", "m", "--version", "v1",
         "--router-url", router_url, "--cache", str(cache), "--registry-timeout-s", "5", *extra],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_pull_reads_the_registry_and_refuses_what_does_not_match(tmp_path):
    artifact = tmp_path / "store" / "m" / "v1"
    artifact.mkdir(parents=True)
    (artifact / "config.json").write_text("{}")
    (artifact / "tokenizer.json").write_text('{"model": {}}')
    settings = {**TEST_ROUTER, "PDSERVE_ADMIN_TOKENS": f"dash:viewer:{VIEWER}"}
    with running_router(**settings) as router:
        registered = router.admin("POST", "/admin/v1/models", {
            "model_id": "m", "version": "v1", "artifact": str(artifact), "max_context": 4096,
            "tokenizer": str(artifact), "checksum": folder_checksum(artifact),
        })  # fmt: skip
        assert registered.status_code == 201, registered.text

        done = pull(router.url, tmp_path / "cache")
        assert done.returncode == 0, done.stderr
        line = json.loads(done.stdout)
        assert line["path"] == str(tmp_path / "cache" / "m" / "v1") and not line["cached"]
        assert folder_checksum(Path(line["path"])) == folder_checksum(artifact)
        assert json.loads(pull(router.url, tmp_path / "cache").stdout)["cached"]

        # The store's copy changed after registration: the registry's checksum wins.
        (artifact / "config.json").write_text('{"tampered": true}')
        refused = pull(router.url, tmp_path / "other-cache")
        assert refused.returncode != 0 and "the registry says" in refused.stderr
        assert not (tmp_path / "other-cache" / "m" / "v1").exists()

        unknown = pull(router.url, tmp_path / "cache", "--version", "v9")
        assert unknown.returncode != 0 and "v9 is not registered" in unknown.stderr
        wrong_token = pull(router.url, tmp_path / "cache", token="nope")
        assert wrong_token.returncode != 0 and "answered 401" in wrong_token.stderr
