"""Profiles (YAML beside this file) and the pydantic models that validate them."""

from configs.profiles import ConfigError, load_profile
from configs.schema import PipelineConfig

__all__ = ["ConfigError", "PipelineConfig", "load_profile"]
