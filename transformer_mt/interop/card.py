"""The model card of an exported model: `README.md` with the Hub's metadata, then what a reader needs.

The metadata block holds the languages, the licence the training corpus imposes, the corpus and a
`model-index` of the run's own evaluations (each `eval/*.json` that `transformer-mt evaluate` wrote, with
its sacreBLEU signatures). The text gives the training command, the corpus with its licence, how to
load the model and its limits. Everything comes from the checkpoint and its run directory; nothing is
invented where the run did not record it (a corpus of the user's own files has licence `other`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from transformer_mt.tables import markdown_table

CARD_FILE = "README.md"


@dataclass(frozen=True)
class CorpusFacts:
    """What the card says of a training corpus."""

    name: str
    licence: str  # the Hub's licence identifier
    source: str  # where it comes from, for a reader
    hub_id: str | None = None  # its dataset on the Hub, when there is one


CORPORA = {
    "tatoeba": CorpusFacts("Tatoeba", "cc-by-2.0",
                      "sentence pairs of tatoeba.org as packaged by manythings.org/anki (CC-BY 2.0 France)"),
    "opus_books": CorpusFacts("OPUS Books", "other",
                         "copyright-free books aligned by OPUS (see opus.nlpl.eu/Books)",
                         "Helsinki-NLP/opus_books"),
}


def corpus_of(dataset: dict[str, Any]) -> CorpusFacts:
    """The corpus a run's dataset section names; files of the user's own say only their names."""
    name = dataset.get("name", "parallel")
    if name in CORPORA:
        return CORPORA[name]
    if name == "hf" and dataset.get("hf_path"):
        hub = str(dataset["hf_path"])
        return CorpusFacts(hub, "other", f"the dataset {hub}", hub)
    files = [Path(str(dataset[k])).name for k in ("path", "src_path", "tgt_path") if dataset.get(k)]
    return CorpusFacts("parallel text files", "other", "the files " + ", ".join(files) if files else "files")


def evaluations(run_dir: Path) -> list[dict[str, Any]]:
    """The run's evaluations (eval/*.json written by `transformer-mt evaluate`), best checkpoint first."""
    found = []
    for path in sorted((run_dir / "eval").glob("*.json")) if run_dir.is_dir() else []:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("bleu"), (int, float)):
            found.append(record)
    return found


def model_index(name: str, src: str, tgt: str, corpus: CorpusFacts,
                records: list[dict[str, Any]]) -> list[dict]:
    """The Hub's `model-index`: one result per evaluated split and search, BLEU and chrF with signatures."""
    results = []
    for record in records:
        dataset = {"type": corpus.hub_id or corpus.name.lower().replace(" ", "_"),
                   "name": f"{corpus.name} {src}-{tgt} ({record.get('set', 'held-out')} split of the run)",
                   "split": str(record.get("set", "test"))}
        search = record.get("search", "")
        metrics = [{"type": "bleu", "name": f"BLEU ({search})", "value": round(float(record["bleu"]), 2),
                    "args": {"signature": record.get("bleu_signature")}}]
        if isinstance(record.get("chrf"), (int, float)):
            metrics.append({"type": "chrf", "name": f"chrF ({search})",
                            "value": round(float(record["chrf"]), 2),
                            "args": {"signature": record.get("chrf_signature")}})
        results.append({"task": {"type": "translation", "name": f"Translation {src}-{tgt}"},
                        "dataset": dataset, "metrics": metrics})
    return [{"name": name, "results": results}] if results else []


def card_text(state: dict[str, Any], run_dir: Path, architecture: str, parameters: int) -> str:
    """The whole `README.md` of an exported model."""
    config = state.get("config", {})
    dataset = config.get("dataset", {})
    src, tgt = dataset.get("src_lang", "src"), dataset.get("tgt_lang", "tgt")
    corpus, records = corpus_of(dataset), evaluations(run_dir)
    name = f"transformer-mt-{src}-{tgt}"
    meta: dict[str, Any] = {"language": [src, tgt], "license": corpus.licence,
                            "library_name": "transformers", "pipeline_tag": "translation",
                            "tags": ["translation", "transformer-mt", architecture]}
    if corpus.hub_id:
        meta["datasets"] = [corpus.hub_id]
    index = model_index(name, src, tgt, corpus, records)
    if index:
        meta["model-index"] = index
    command = " ".join(["transformer-mt train", *state.get("overrides", [])])
    model = config.get("model", {})
    scores = markdown_table(["split", "search", "sentences", "BLEU", "chrF"],
                            [[r.get("set"), r.get("search"), r.get("n"), f"{r['bleu']:.2f}",
                              f"{r.get('chrf', float('nan')):.2f}"] for r in records], align="llrrr")
    lines = [
        "---", yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
        f"# {name}", "",
        f"A Transformer encoder-decoder ({architecture} layout, {parameters:,} parameters, "
        f"{model.get('encoder_layers', '?')}+{model.get('decoder_layers', '?')} layers, d_model "
        f"{model.get('d_model', '?')}) that translates {src} into {tgt}, trained with transformer-mt and "
        "exported to the Transformers format.", "",
        "## Use", "", "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        'tokenizer = AutoTokenizer.from_pretrained("<this directory>")',
        'model = AutoModelForSeq2SeqLM.from_pretrained("<this directory>")',
        'batch = tokenizer(["Hello, world."], return_tensors="pt", padding=True)',
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))", "```", "",
        "`generation_config.json` holds the run's decoding settings (beam size and the length limit);",
        "`transformer_mt.json` the rule that sets the length limit per sentence.", "",
        "## Training", "", "```bash", command, "```", "",
        f"Trained for {state.get('step', '?')} updates on {corpus.source}; licence of the corpus: "
        f"`{corpus.licence}`.", "",
    ]
    if records:
        lines += ["## Evaluation", "",
                  "On the run's own held-out split (no sentence of it occurs in training or validation):", "",
                  scores, "",
                  f"Signatures: BLEU `{records[0].get('bleu_signature')}`, "
                  f"chrF `{records[0].get('chrf_signature')}`.",
                  ""]
    lines += ["## Limits", "",
              f"- Trained on {corpus.name} alone: expect worse translations far from its domain and style.",
              f"- One sentence at a time, up to {model.get('max_positions', '?')} subword tokens; no context "
              "across sentences.",
              "- Input is not normalised: ALL CAPS or text full of typos may translate worse than the same "
              "text written as the corpus writes it.", ""]
    return "\n".join(lines)


def write_card(state: dict[str, Any], run_dir: Path, directory: Path, architecture: str,
               parameters: int) -> None:
    """Write `README.md` into an export directory."""
    (directory / CARD_FILE).write_text(card_text(state, run_dir, architecture, parameters), encoding="utf-8")
