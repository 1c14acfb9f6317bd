"""`transformer-mt export format=onnx`: the Hugging Face export (hf.py) plus its ONNX graphs, laid out as
optimum's ORTModelForSeq2SeqLM and Transformers.js read them (the `onnx` extra).

    <output_dir>/config.json, generation_config.json, tokenizer.json, ...   (format=hf's files)
    <output_dir>/onnx/encoder_model.onnx, decoder_model_merged.onnx             (float32)
    <output_dir>/onnx/encoder_model_quantized.onnx, decoder_model_merged_quantized.onnx   (int8)

The graphs come from optimum's exporter (task text2text-generation-with-past: an encoder, and one decoder
whose `use_cache_branch` input chooses between the first step and the steps with the past keys and
values); Transformers.js uses only these two, so optimum's unmerged decoders are left out. The int8 copies
are ONNX Runtime's dynamic quantization of the weights of each matrix product with a constant operand
(MatMulConstBOnly, as Transformers.js's own q8 models; the attention's products of activations stay
float32), inside the decoder's branches too (EnableSubgraph).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from transformer_mt.config import ConfigError
from transformer_mt.errors import ExportError
from transformer_mt.interop.hf import export_hf
from transformer_mt.runtime.files import META_FILE, refuse_existing, written_into

log = logging.getLogger(__name__)
INSTALL = "pip install 'transformer-mt[onnx]'"
ONNX_DIR = "onnx"
GRAPHS = ("encoder_model", "decoder_model_merged")  # the names optimum writes and Transformers.js reads
QUANTIZED = "_quantized"  # Transformers.js's file suffix for dtype q8


def _optimum_export() -> Any:
    """optimum's main_export, or a ConfigError naming the extra that installs it."""
    try:
        import onnxruntime  # noqa: F401 - the quantizer and the runtime the files are checked with
        from optimum.exporters.onnx import main_export
    except ImportError as ex:
        raise ConfigError(f"format=onnx needs optimum's ONNX exporter and onnxruntime: {INSTALL}") from ex
    return main_export


def quantize(source: Path, target: Path) -> None:
    """An int8 copy of one graph: its weights quantized, its activations quantized on the fly."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8,
                     extra_options={"EnableSubgraph": True, "MatMulConstBOnly": True})


def export_onnx(checkpoint: str | Path, output_dir: Path, overwrite: bool = False) -> Path:
    """Write the Hugging Face directory of a checkpoint with its ONNX graphs, float32 and int8; return
    its path. Nothing is left half-written: the directory appears whole or not at all."""
    main_export = _optimum_export()
    output_dir = Path(output_dir)
    refuse_existing(output_dir, overwrite)  # before the minutes of exporting, not after
    parent = output_dir.expanduser().resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".onnx-export.", dir=parent) as work:
        raw = Path(work) / "optimum"
        hf_dir = export_hf(checkpoint, Path(work) / "hf", overwrite=True)
        try:
            main_export(str(hf_dir), output=str(raw), task="text2text-generation-with-past", device="cpu")
        except Exception as ex:  # optimum and torch.onnx raise many kinds; the first line says what
            first = str(ex).strip().splitlines()[0] if str(ex).strip() else type(ex).__name__
            raise ExportError(f"optimum could not export {checkpoint} to ONNX: {first}") from ex
        graphs = hf_dir / ONNX_DIR
        graphs.mkdir()
        for name in GRAPHS:
            shutil.move(raw / f"{name}.onnx", graphs / f"{name}.onnx")
            quantize(graphs / f"{name}.onnx", graphs / f"{name}{QUANTIZED}.onnx")
        meta = json.loads((hf_dir / META_FILE).read_text(encoding="utf-8"))
        meta |= {"format": "onnx", "onnx": sorted(f"{ONNX_DIR}/{g.name}" for g in graphs.iterdir())}
        (hf_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return _moved(hf_dir, output_dir, overwrite)


def _moved(built: Path, output_dir: Path, overwrite: bool) -> Path:
    """The finished directory moved to output_dir (an existing one replaced only with overwrite)."""
    with written_into(output_dir, overwrite) as tmp:
        for item in built.iterdir():
            shutil.move(item, tmp / item.name)
    log.info("exported %s with its ONNX graphs (float32 and int8) in %s/", output_dir, ONNX_DIR)
    return output_dir
