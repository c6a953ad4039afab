"""``pdserve model NAME``: prepare a known model, or check a folder, and print its path."""

from __future__ import annotations

import argparse

from modelstore.known import KNOWN, resolve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"one of {', '.join(KNOWN)}, or a model folder")


def main(args: argparse.Namespace) -> int:
    path, served = resolve(args.name)
    print(f"{served}\t{path}")
    return 0
