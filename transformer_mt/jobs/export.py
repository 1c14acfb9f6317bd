"""The `export` job: a checkpoint as a CTranslate2 model directory (`transformer_mt.decoding.ct2`)."""

from __future__ import annotations

from pathlib import Path

from transformer_mt.config import ExportConfig
from transformer_mt.decoding.ct2 import export_ctranslate2


def export(cfg: ExportConfig) -> Path:
    """Entry point of `transformer-mt export`: writes <run dir>/ct2-<quantization> (or output_dir)."""
    assert cfg.checkpoint is not None  # validate() requires it
    if cfg.output_dir:
        output_dir = Path(cfg.output_dir)
    else:
        source = Path(cfg.checkpoint).expanduser()
        output_dir = (source if source.is_dir() else source.parent) / f"ct2-{cfg.quantization}"
    path = export_ctranslate2(cfg.checkpoint, output_dir, cfg.quantization)
    print(path)
    return path
