"""Configuration: pydantic models, the provider catalog and YAML loading."""

from sidecar.config.loading import ConfigError, ConfigProblem, load_config_file, load_config_text
from sidecar.config.models import Caller, ModelGroup, Provider, SidecarConfig, Target

__all__ = [
    "Caller",
    "ConfigError",
    "ConfigProblem",
    "ModelGroup",
    "Provider",
    "SidecarConfig",
    "Target",
    "load_config_file",
    "load_config_text",
]
