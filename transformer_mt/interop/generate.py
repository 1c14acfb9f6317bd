"""Translating with an exported directory as `transformer-mt translate` does: Hugging Face `generate` on
the PyTorch weights (format=hf) or on optimum's ONNX Runtime graphs (format=onnx), one sentence at a time
with our length rule, which `generate` lacks (transformer_mt.json holds it).

    >>> from transformer_mt.interop.generate import ExportedModel
    >>> ExportedModel.load("hf-model").translate(["Where is the station?"])          # greedy
    >>> ExportedModel.load("onnx-model", runtime="onnx", int8=True).translate([...], num_beams=5)

Greedy search picks the same tokens as ours (float32); beam search ranks finished hypotheses by
sum / length^exponent, not GNMT's penalty: the exponent nearest to ours is passed for each sentence
(`decoding.search.gnmt_slope` at the source's length), and a few beams still end otherwise.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_mt.decoding.search import gnmt_slope, max_output_length
from transformer_mt.runtime.files import META_FILE

RUNTIMES = ("hf", "onnx")


@dataclass
class ExportedModel:
    """An exported directory loaded for `generate`: the model, its tokenizer and our length rule."""

    model: Any
    tokenizer: Any
    rule: dict[str, float]
    max_positions: int
    _links: Any = None  # the temporary folder the int8 graphs are read through, kept while loaded

    @classmethod
    def load(cls, directory: str | Path, runtime: str = "hf", int8: bool = False) -> ExportedModel:
        """`runtime="hf"`: transformers' AutoModelForSeq2SeqLM; "onnx": optimum's ORTModelForSeq2SeqLM on
        the float32 graphs, or with `int8` on the quantized ones."""
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        directory = Path(directory)
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        links = None
        if runtime == "hf":
            model = AutoModelForSeq2SeqLM.from_pretrained(str(directory)).eval()
        elif runtime == "onnx":
            from optimum.onnxruntime import ORTModelForSeq2SeqLM

            folder = directory
            if int8:  # optimum finds the merged decoder by its float32 name only: read links under it
                links = tempfile.TemporaryDirectory(prefix="int8-graphs.")
                folder = Path(links.name)
                for item in directory.iterdir():
                    if item.name != "onnx":
                        os.symlink(item.resolve(), folder / item.name)
                (folder / "onnx").mkdir()
                for graph in ("encoder_model", "decoder_model_merged"):
                    os.symlink((directory / "onnx" / f"{graph}_quantized.onnx").resolve(),
                               folder / "onnx" / f"{graph}.onnx")
            model = ORTModelForSeq2SeqLM.from_pretrained(str(folder), subfolder="onnx")
        else:
            raise ValueError(f"runtime={runtime!r}: one of {', '.join(RUNTIMES)}")
        return cls(model, tokenizer, meta["decoding"], config["max_position_embeddings"], links)

    def translate(self, sentences: list[str], num_beams: int = 1) -> list[str]:
        """The translation of each sentence, one at a time (no padding), with our length limit."""
        import torch

        out = []
        with torch.inference_mode():
            for sentence in sentences:
                inputs = self.tokenizer(sentence, return_tensors="pt")
                n = inputs["input_ids"].shape[1]
                beams: dict[str, Any] = {"num_beams": num_beams}
                if num_beams > 1:  # greedy search has no length penalty (generate warns of one given)
                    beams["length_penalty"] = gnmt_slope(n, self.rule["length_penalty"])
                rule = self.rule
                limit = max_output_length(n, rule["max_len_a"], rule["max_len_b"], self.max_positions)
                ids = self.model.generate(**inputs, max_new_tokens=limit + 1, do_sample=False, **beams)
                out.append(self.tokenizer.decode(ids[0], skip_special_tokens=True))
        return out

    def close(self) -> None:
        if self._links is not None:
            self._links.cleanup()

