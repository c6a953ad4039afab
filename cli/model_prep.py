"""``pdserve model NAME``: prepare a known model, or check a folder, and print its path.

``pdserve model pull MODEL --version V``: copy a registered version from its artifact
store into a cache, verified against the registry's checksum (modelstore/pull.py); a
Kubernetes init container runs it, so no pod is "starting" while weights download. The
artifact and checksum come from the router's registry (``--router-url``, a viewer token
in ``PDSERVE_VIEWER_TOKEN``), or are given (``--store``, ``--checksum``). It prints one
JSON line: where the version is and how long copying and verifying took.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from modelstore.cache import cache_root
from modelstore.known import KNOWN, resolve
from modelstore.pull import PullError, pull


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"one of {', '.join(KNOWN)}, a model folder, or `pull`")
    parser.add_argument("model", nargs="?", help="with pull: the registered model id")
    parser.add_argument("--version", help="with pull: the registered version")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="with pull: the cache folder (default: $PDSERVE_CACHE_DIR/pulled)",
    )
    parser.add_argument("--router-url", default=os.environ.get("PDSERVE_ROUTER_URL"),
                        help="with pull: read the artifact and checksum from this router's "
                        "registry (token: $PDSERVE_VIEWER_TOKEN)")  # fmt: skip
    parser.add_argument("--store", default=None,
                        help="with pull: the store folder holding MODEL/VERSION (default: "
                        "the registered artifact)")  # fmt: skip
    parser.add_argument(
        "--checksum", default=None, help="with pull: the expected checksum, when no router is asked"
    )
    parser.add_argument("--registry-timeout-s", type=float, default=600,
                        help="with pull: how long to wait for the router to answer (an "
                        "init container may start before it)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    if args.name != "pull":
        path, served = resolve(args.name)
        print(f"{served}\t{path}")
        return 0
    if not args.model or not args.version:
        raise SystemExit("pdserve model pull MODEL --version VERSION")
    source, checksum = _artifact(args)
    cache = args.cache or cache_root() / "pulled"
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        pulled = pull(source, model=args.model, version=args.version, checksum=checksum,
                      cache=cache, progress=say)  # fmt: skip
    except PullError as error:
        raise SystemExit(f"pdserve model pull: {error}") from None
    print(json.dumps({
        "model": args.model, "version": args.version, "path": str(pulled.path),
        "cached": pulled.cached, "bytes_copied": pulled.bytes_copied,
        "copy_s": round(pulled.copy_s, 3), "verify_s": round(pulled.verify_s, 3),
    }))  # fmt: skip
    return 0


def _artifact(args: argparse.Namespace) -> tuple[str, str]:
    """Where the version's files are, and the checksum they must have."""
    if args.router_url:
        registered = _registered(args.router_url, args.model, args.version,
                                 args.registry_timeout_s)  # fmt: skip
        source = registered["artifact"]
        if args.store:
            source = str(Path(args.store) / args.model / args.version)
        return source, registered["checksum"]
    if not (args.store and args.checksum):
        raise SystemExit("pdserve model pull: give --router-url, or --store and --checksum")
    return str(Path(args.store) / args.model / args.version), args.checksum


def _registered(router_url: str, model: str, version: str, timeout_s: float) -> dict:
    """The registry's entry for ``model`` ``version``; waits (bounded) for the router."""
    request = urllib.request.Request(
        router_url.rstrip("/") + "/admin/v1/models",
        headers={"Authorization": f"Bearer {os.environ.get('PDSERVE_VIEWER_TOKEN', '')}"},
    )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                models = json.load(response)["models"]
            break
        except urllib.error.HTTPError as error:
            raise SystemExit(f"pdserve model pull: the registry answered {error.code}") from None
        except OSError as error:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"pdserve model pull: no router at {router_url}: {error}"
                ) from None
            time.sleep(2)
    for entry in models:
        if entry["model_id"] == model and entry["version"] == version:
            return entry
    raise SystemExit(f"pdserve model pull: {model} {version} is not registered")
