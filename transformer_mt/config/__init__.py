"""The config layer: the typed schema of every setting (schema.py, the sections; commands.py, each command's
config), the rules for their values (checks.py, dataset_checks.py, problems.py), how YAML and overrides
become typed configs (typed.py, overrides.py, resolvers.py), and the rules for command-line arguments
(arguments.py). `transformer_mt.config` is the schema's public name."""

from transformer_mt.config.commands import (
    SCHEMAS,
    BatchingConfig,
    EngineConfig,
    EvaluateConfig,
    ExportConfig,
    LimitsConfig,
    ScoreConfig,
    ServeConfig,
    TrainConfig,
    TranslateConfig,
    validate,
)
from transformer_mt.config.schema import (
    CONFIG_DIR,
    CheckpointConfig,
    DatasetConfig,
    DecodingConfig,
    DeviceConfig,
    DistillConfig,
    DocumentConfig,
    MixedCorpus,
    ModelConfig,
    SearchConfig,
    Section,
    TokenizerConfig,
    TrainingConfig,
    VariantsConfig,
    resolve_path,
)
from transformer_mt.errors import CheckpointError, ConfigError, DataError, TrainingError, UserError

__all__ = ["CONFIG_DIR", "SCHEMAS", "BatchingConfig", "CheckpointConfig", "CheckpointError", "ConfigError",
           "DataError", "DatasetConfig", "DecodingConfig", "DeviceConfig", "DistillConfig",
           "DocumentConfig", "EngineConfig", "EvaluateConfig", "ExportConfig", "LimitsConfig",
           "MixedCorpus", "ModelConfig", "ScoreConfig", "SearchConfig", "Section", "ServeConfig",
           "TokenizerConfig", "TrainConfig", "TrainingConfig", "TranslateConfig", "TrainingError",
           "UserError", "VariantsConfig", "resolve_path", "validate"]
