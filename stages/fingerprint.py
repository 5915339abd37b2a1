"""Fingerprints that tie a checkpoint to the run that wrote it: to its config but for the
settings that say only how often it logs or saves (`configs.strict.HOW_IT_RUNS`), so a stage resumed
with another checkpoint interval finds its checkpoints."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel

from configs.strict import computed_settings


def fingerprint(config: BaseModel, *parts: object) -> str:
    payload = json.dumps([computed_settings(config), [str(p) for p in parts]], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
