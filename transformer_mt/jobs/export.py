"""The `export` job: a checkpoint as a CTranslate2 model directory (`transformer_mt.decoding.ct2`), a
Hugging Face Transformers one (`transformer_mt.interop.hf`), that with its ONNX graphs (`interop.onnx`), or
a page that translates in the browser (`interop.web`)."""

from __future__ import annotations

from pathlib import Path

from transformer_mt.config import ExportConfig


def export(cfg: ExportConfig) -> Path:
    """Entry point of `transformer-mt export`: writes <run dir>/ct2-<quantization> or <run dir>/<format>
    (or output_dir)."""
    assert cfg.checkpoint is not None  # validate() requires it
    if cfg.output_dir:
        output_dir = Path(cfg.output_dir)
    else:
        source = Path(cfg.checkpoint).expanduser()
        name = f"ct2-{cfg.quantization}" if cfg.format == "ct2" else cfg.format
        output_dir = (source if source.is_dir() else source.parent) / name
    if cfg.format == "hf":
        from transformer_mt.interop.hf import export_hf

        path = export_hf(cfg.checkpoint, output_dir, cfg.overwrite)
    elif cfg.format == "onnx":
        from transformer_mt.interop.onnx import export_onnx

        path = export_onnx(cfg.checkpoint, output_dir, cfg.overwrite)
    elif cfg.format == "web":
        from transformer_mt.interop.web import export_web

        path = export_web(cfg.checkpoint, output_dir, cfg.overwrite, glossary=cfg.glossary)
    else:
        from transformer_mt.interop.ct2_export import export_ctranslate2

        path = export_ctranslate2(cfg.checkpoint, output_dir, cfg.quantization, cfg.overwrite)
    print(path)
    return path
