"""The run configuration: one typed schema, validated before any work starts.

Flower hands the app a flat mapping with kebab-case keys (``local-steps``); the schema uses the
snake_case form of the same names. :mod:`.names` holds the words (the error, the key
spelling, the choices), :mod:`.schema` the keys with their defaults, docs and checks, and
:mod:`.load` merges a run's layers over it. May import :mod:`dept.paths` and
:mod:`dept.model` (the tables its choices come from), nothing else of the core.
"""

from dept.config.checks import check_device_name, privacy_conflict
from dept.config.load import (
    ConfigKey,
    YamlLoader,
    build_structured,
    config_keys,
    load_config,
    to_run_config,
)
from dept.config.names import (
    AGGREGATIONS,
    COMPRESSIONS,
    DOWNLOADS,
    MAX_VOCAB_SIZE,
    MIN_VOCAB_SIZE,
    OUTLIER_ACTIONS,
    SERVER_MEMORIES,
    AggregationName,
    CompressionName,
    ConfigError,
    DataParallelName,
    InnerName,
    OutlierAction,
    ServerMemory,
    kebab,
    snake,
)
from dept.config.schema import DeptConfig

__all__ = [
    "AGGREGATIONS",
    "COMPRESSIONS",
    "DOWNLOADS",
    "MAX_VOCAB_SIZE",
    "MIN_VOCAB_SIZE",
    "OUTLIER_ACTIONS",
    "SERVER_MEMORIES",
    "AggregationName",
    "CompressionName",
    "ConfigError",
    "ConfigKey",
    "DataParallelName",
    "DeptConfig",
    "InnerName",
    "OutlierAction",
    "ServerMemory",
    "YamlLoader",
    "build_structured",
    "check_device_name",
    "config_keys",
    "kebab",
    "load_config",
    "privacy_conflict",
    "snake",
    "to_run_config",
]
