"""Reading and comparing ``/v1/embeddings`` answers (float or base64) in real-tier tests."""

from __future__ import annotations

import base64

import numpy as np


def vectors(answer: dict) -> list[np.ndarray]:
    out = []
    for item in sorted(answer["data"], key=lambda d: d["index"]):
        embedding = item["embedding"]
        if isinstance(embedding, str):
            embedding = np.frombuffer(base64.b64decode(embedding), dtype="<f4")
        out.append(np.asarray(embedding, dtype=np.float64))
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
