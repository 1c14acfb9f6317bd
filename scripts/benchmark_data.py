"""Data preparation at scale: throughput and peak memory for synthetic corpora of growing size.

    python scripts/benchmark_data.py [--sizes 200000 1000000 4000000] [--out data.json]

For each size the script writes a synthetic parallel corpus (two plain files of Zipf-distributed pseudo
words, 3-20 words a sentence, some sentences repeated), then, each in a fresh child process:
- prepares it as `transformer-mt train dataset=parallel` would (keys, split, a BPE tokenizer on its
  bounded sample, encoding into the memory-mapped cache): pairs/s and peak resident memory;
- prepares it again from the cache and builds the first epoch's token batches: the time until training
  could start, and that process's peak memory.
Memory should stay flat in the corpus size: the corpus is streamed and the training ids memory-mapped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from timing import machine  # beside this script

from transformer_mt.tables import markdown_table


def write_corpus(folder: Path, n: int, seed: int = 0) -> tuple[Path, Path]:
    """n aligned pseudo-sentence pairs in folder/train.src and folder/train.tgt (written in chunks)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    # letters[rng.integers(0, 26, size)] draws what rng.choice(letters, size) draws, at half its cost
    vocab = [["".join(letters[rng.integers(0, 26, size=rng.integers(2, 9))]) for _ in range(20_000)]
             for _ in range(2)]
    paths = folder / "train.src", folder / "train.tgt"
    with paths[0].open("w", encoding="utf-8") as src, paths[1].open("w", encoding="utf-8") as tgt:
        for start in range(0, n, 100_000):
            count = min(100_000, n - start)
            lengths = rng.integers(3, 21, size=count)
            words = np.minimum(rng.zipf(1.3, size=(2, int(lengths.sum()))) - 1, 19_999)
            cuts = np.r_[0, np.cumsum(lengths)]
            for side, out in ((0, src), (1, tgt)):
                lines = [" ".join(vocab[side][w] for w in words[side, a:b])
                         for a, b in zip(cuts[:-1], cuts[1:])]
                if side == 0:  # one source sentence in ten again: corpora repeat themselves
                    for i in range(5, count, 10):
                        lines[i] = lines[i - 5]
                out.write("\n".join(lines) + "\n")
    return paths


def _status_kib(field: str) -> int:
    return next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith(f"{field}:"))


class AnonymousPeak(threading.Thread):
    """The peak of the process's anonymous memory (RssAnon), sampled every few ms. VmHWM, the peak
    RSS, also counts pages of memory-mapped files that were read; those stay in the OS's page cache
    and are given back under memory pressure, so the anonymous peak is what a corpus really costs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.005):
            self.peak = max(self.peak, _status_kib("RssAnon"))


def child(mode: str, src: str, tgt: str, cache: str) -> None:
    """Prepare (mode=build) or load and batch (mode=start); print seconds and peak memory as JSON."""
    sampler = AnonymousPeak()
    sampler.start()
    started = time.perf_counter()
    from transformer_mt.config import DatasetConfig, TokenizerConfig
    from transformer_mt.data import TokenBatchSampler, prepare_data

    cfg = DatasetConfig(name="parallel", path=None, url=None, src_path=src, tgt_path=tgt, src_lang="xx",
                        tgt_lang="yy", cache_dir=cache, max_len=64)
    data = prepare_data(cfg, TokenizerConfig(kind="bpe", vocab_size=8000))
    if mode == "start":
        TokenBatchSampler(data.train.lengths(), 4096, seed=1).batches(0)
    seconds = time.perf_counter() - started
    sampler.done.set()
    sampler.join()
    print(json.dumps({"seconds": seconds, "peak_rss_mib": _status_kib("VmHWM") / 1024,
                      "peak_anon_mib": max(sampler.peak, _status_kib("RssAnon")) / 1024,
                      "train_pairs": len(data.train), "cache_hit": data.stats["cache_hit"]}))


def run_child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(n: int, folder: Path) -> dict:
    """Write a corpus of n pairs into folder, prepare it, then start from its cache: one row."""
    folder.mkdir()
    src, tgt = write_corpus(folder, n)
    build = run_child("build", str(src), str(tgt), str(folder / "cache"))
    start = run_child("start", str(src), str(tgt), str(folder / "cache"))
    return {"pairs": n, "corpus_mib": (src.stat().st_size + tgt.stat().st_size) / 2**20,
            "prepare_seconds": build["seconds"], "pairs_per_s": n / build["seconds"],
            "prepare_peak_rss_mib": build["peak_rss_mib"], "prepare_peak_anon_mib": build["peak_anon_mib"],
            "start_from_cache_seconds": start["seconds"], "start_peak_rss_mib": start["peak_rss_mib"],
            "start_peak_anon_mib": start["peak_anon_mib"]}


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    header = ["pairs", "corpus (MiB)", "prepare (s)", "pairs/s", "prepare: peak RSS / anonymous (MiB)",
              "start from cache (s)", "start: peak RSS / anonymous (MiB)"]
    cells = [[f"{r['pairs']:,}", f"{r['corpus_mib']:.0f}", f"{r['prepare_seconds']:.1f}",
              f"{r['pairs_per_s']:,.0f}",
              f"{r['prepare_peak_rss_mib']:.0f} / {r['prepare_peak_anon_mib']:.0f}",
              f"{r['start_from_cache_seconds']:.1f}",
              f"{r['start_peak_rss_mib']:.0f} / {r['start_peak_anon_mib']:.0f}"] for r in rows]
    return markdown_table(header, cells, align="r" * len(header))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000, 4_000_000])
    parser.add_argument("--out", type=Path, default=Path("benchmark_data.json"))
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            rows.append(measure(n, Path(tmp) / str(n)))
            print(json.dumps(rows[-1]), flush=True)
    smallest = rows[0]
    ratio = rows[-1]["prepare_peak_rss_mib"] / smallest["prepare_peak_rss_mib"]
    anon = rows[-1]["prepare_peak_anon_mib"] / smallest["prepare_peak_anon_mib"]
    result = {"machine": machine(), "rows": rows, "rss_ratio_largest_vs_smallest": ratio,
              "anon_ratio_largest_vs_smallest": anon}
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nMachine: {result['machine']}\n")
    print(table(rows))
    print(f"\npreparing {rows[-1]['pairs']:,} against {smallest['pairs']:,} pairs: peak RSS "
          f"{ratio:.2f}x, peak anonymous memory {anon:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
