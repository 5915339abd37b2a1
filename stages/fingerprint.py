"""Fingerprints that tie a checkpoint to the run that wrote it."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel


def fingerprint(config: BaseModel, *parts: object) -> str:
    payload = json.dumps([config.model_dump(mode="json"), [str(p) for p in parts]], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
