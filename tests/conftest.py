"""Shared fixtures: the real corpus beside the checkout, tiny training overrides, the one trained run the
tests share, and the two ways to run a command: in this process (compose the config, call the job) or as
a user would (a subprocess)."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import logging
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import torch
from filelock import FileLock

# Tests never use the network: Hugging Face libraries read only local files and caches.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One thread, here and in the commands the tests start: their models are tiny, and on a busy machine a
# second thread waits for a free core at every operation (OMP_NUM_THREADS=N overrides this).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

ROOT = Path(__file__).resolve().parents[1]
CORPORA = (ROOT.parent / "shared" / "data" / "fra-eng.zip", ROOT / "data" / "fra-eng.zip")
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
FIXTURES = ROOT / "tests" / "fixtures"
# The files whose tests take longest, longest first (by CPU time: with a worker on each core, their time):
# scripts/test.sh has pytest-xdist (--dist loadfile --no-loadscope-reorder) hand files to its workers in
# collection order, so the long ones start first and the short ones fill in after them.
LONGEST_FIRST = ("test_onnx_export.py", "test_distill.py", "test_faults.py", "test_plan.py",
                 "test_finetune.py", "test_copy_variants.py", "test_hf_directory.py", "test_segmentation.py",
                 "test_serve_requests.py", "test_sweep.py", "test_constraints.py", "test_serve.py",
                 "test_budget_and_averaging.py", "test_variants.py", "test_run_directory.py", "test_data.py",
                 "test_export.py", "test_layout.py", "test_web_glossary.py", "test_confidence.py",
                 "test_languages.py", "test_checkpoint_checks.py", "test_serve_isolation.py", "test_cli.py",
                 "test_documents_cli.py", "test_train.py", "test_documents_formats.py", "test_experiments.py",
                 "test_scripts.py", "test_decoding_features.py", "test_score.py", "test_glossary_use.py")


def script_module(name: str) -> Any:
    """A module of scripts/ by name (scripts/<name>.py), imported as the scripts import their siblings."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def under_ci() -> bool:
    """Whether the suite runs under CI: `CI` set to anything but empty, 0 or false (.ci/run sets it)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def missing(what: str) -> NoReturn:
    """What a test needs (a corpus under ../shared, a browser, an extra) is not on this machine: the test
    (or, called at a module's top, its whole file) is skipped with `what`, except under CI, which must run
    the whole suite, so there it fails."""
    if under_ci():
        pytest.fail(f"{what} (CI is set: the whole suite must run here)")
    pytest.skip(what, allow_module_level=True)


def require(module: str) -> Any:
    """`module` imported; where it is not installed (an extra), `missing` says so: skipped, or under CI,
    which installs every extra, failed."""
    try:
        return importlib.import_module(module)
    except ImportError as ex:
        missing(f"{module} is not installed ({ex}); install the extras: pip install -e '.[dev,all]'")


def tatoeba_corpus() -> Path:
    """The real Tatoeba zip from ../shared/data (or data/ in the checkout); `missing` without it."""
    found = next((path for path in CORPORA if path.is_file()), None)
    return found or missing("Tatoeba corpus not found at ../shared/data/fra-eng.zip or data/fra-eng.zip")


def multi30k() -> Path:
    """The Multi30k folder under ../shared/data (its English and French at least); `missing` without it."""
    if not all((MULTI30K / f"train.{lang}.gz").is_file() for lang in ("en", "fr")):
        missing("Multi30k not found at ../shared/data/multi30k")
    return MULTI30K


def tatoeba_sample(corpus: Path, every: int, n: int) -> list[tuple[str, str]]:
    """n (English, French) pairs of the Tatoeba zip, every `every`-th line: short and long alike."""
    with zipfile.ZipFile(corpus) as z:
        lines = z.read("fra.txt").decode("utf-8").splitlines()[::every][:n]
    return [(fields[0], fields[1]) for fields in (line.split("\t") for line in lines)]


def encoded_split(vocab: Any, pairs: list[tuple[str, str]]) -> Any:
    """The pairs encoded by `vocab` as an EncodedSplit, as data.encode holds a split."""
    import numpy as np

    from transformer_mt.data import EncodedSplit, Ragged

    def ragged(ids: list[list[int]]) -> Ragged:
        offsets = np.concatenate([[0], np.cumsum([len(s) for s in ids])])
        return Ragged.from_offsets(np.array([i for s in ids for i in s], dtype=np.int32), offsets)
    return EncodedSplit(ragged(vocab.encode_src([p[0] for p in pairs])),
                        ragged(vocab.encode_tgt([p[1] for p in pairs])))


def fitted_checkpoint(pairs: tuple[list[str], list[str]], directory: Path, steps: int,
                      **model: Any) -> tuple[Path, Any]:
    """A tiny model fitted for a few seconds so that its greedy outputs are real words (a BPE of 500),
    saved with the checkpoint keys train.py writes (minus the optimizer state, which no reader of a
    finished model needs): (the directory, the model)."""
    import torch.nn.functional as F

    from transformer_mt.checkpoints.store import build_model, model_spec, save_checkpoint
    from transformer_mt.config import ModelConfig, TokenizerConfig
    from transformer_mt.data import collate
    from transformer_mt.data.tokenizer import PAD_ID, train_tokenizers

    torch.manual_seed(0)
    en, fr = pairs
    vocab = train_tokenizers(TokenizerConfig(kind="bpe", vocab_size=500, min_frequency=2), en, fr)
    shape = {"d_model": 64, "n_heads": 4, "d_ff": 128, "encoder_layers": 2, "decoder_layers": 2}
    config = ModelConfig(**{**shape, "dropout": 0.0, "max_positions": 128, **model})
    net = build_model(config, vocab)
    src, tgt = vocab.encode_src(en), vocab.encode_tgt(fr)
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, len(src), (32,), generator=generator).tolist()
        batch = collate([src[i] for i in idx], [tgt[i] for i in idx], PAD_ID)
        loss = F.cross_entropy(net(batch.src, batch.tgt_in).flatten(0, 1), batch.tgt_out.flatten(),
                               ignore_index=PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    net.eval()
    directory.mkdir(parents=True, exist_ok=True)
    save_checkpoint({"model_config": model_spec(net), "config": {}, "overrides": [],
                     "tokenizer": vocab.to_json(), "model": net.state_dict(), "epoch": 1,
                     "step": steps}, directory / "best.pt")
    return directory, net


@pytest.fixture(scope="session")
def fit_pairs(corpus: Path) -> tuple[list[str], list[str]]:
    """300 Tatoeba pairs, sampled across the corpus: what fitted_checkpoint trains on."""
    from transformer_mt.config import DatasetConfig
    from transformer_mt.data import load_pairs
    from transformer_mt.data.cache import sample_indices

    english, french = load_pairs(DatasetConfig(path=str(corpus), url=None))
    keep = sample_indices(len(english), 300, 7).tolist()
    return [english[i] for i in keep], [french[i] for i in keep]


# The architectures of the fitted models that the export tests share (fitted_model): post-norm (Marian)
# and pre-norm (Pegasus, what the plan trains), this one with a deep encoder and a one-layer decoder (a
# student's shape, model=student), so that every export shows it keeps each stack's own depth.
ARCHITECTURES = {"marian": {}, "pegasus": {"norm_first": True, "activation": "gelu", "encoder_layers": 3,
                                           "decoder_layers": 1}}


@pytest.fixture(scope="session")
def fitted_model(fit_pairs: tuple[list[str], list[str]],
                 tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Path], Path]:
    """`fitted_model(architecture, folder)`: fitted_checkpoint of that architecture of ARCHITECTURES (80
    steps on fit_pairs) in `folder` (best.pt), for the tests to export and write into. Each is trained
    once a session for every pytest-xdist worker (the first to need it, under a file lock in the directory
    they share: training is deterministic, so the model is the one each would have trained) and copied."""
    shared = shared_folder(tmp_path_factory) / "fitted"
    shared.mkdir(exist_ok=True)

    def fitted(architecture: str, folder: Path) -> Path:
        trained = shared / architecture
        with FileLock(str(shared / f"{architecture}.lock")):
            if not (trained / "best.pt").is_file():
                partial = shared / f".{architecture}"
                fitted_checkpoint(fit_pairs, partial, steps=80, **ARCHITECTURES[architecture])
                os.replace(partial, trained)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(trained / "best.pt", folder / "best.pt")
        return folder

    return fitted


def as_teacher(fitted: Path, split_from: Path) -> Path:
    """A fitted model's folder (fitted_model) made a run a student can be distilled from (distill.teacher):
    its checkpoint given the config a run records (its languages, its tokenizer's settings) and the split
    files of the run whose data the student reads (the teacher's held-out pairs must be the student's)."""
    from transformer_mt.checkpoints.store import load_checkpoint, save_checkpoint
    from transformer_mt.config import TokenizerConfig

    state = load_checkpoint(fitted / "best.pt")
    tokenizer = TokenizerConfig(kind="bpe", vocab_size=500, min_frequency=2)  # as fitted_checkpoint's
    state["config"] = {"dataset": {"src_lang": "en", "tgt_lang": "fr"},
                       "tokenizer": dataclasses.asdict(tokenizer)}
    save_checkpoint(state, fitted / "best.pt")
    shutil.copytree(split_from / "split", fitted / "split", dirs_exist_ok=True)
    return fitted


@pytest.fixture(scope="session")
def corpus() -> Path:
    """The real Tatoeba zip (tatoeba_corpus): tests needing it skip without it, or fail under CI."""
    return tatoeba_corpus()


@pytest.fixture(autouse=True)
def keep_torch_threads() -> Iterator[None]:
    """A job run in this process sets torch's thread count (device.num_threads); restore it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# The encoded-corpus cache that runs of tiny_overrides share (its directory in this variable, set by
# `shared_data_cache`; an environment variable because the test modules import this file under another
# name than pytest does): preparing the tiny runs' 600 pairs reads all of Tatoeba to split it leak-free,
# seconds that each run would pay again. The cache is keyed by what decides its content and written under
# a temporary name, so workers and the commands they start share it safely; tests of the cache itself
# give a dataset.cache_dir of their own.
DATA_CACHE = "TMT_TEST_DATA_CACHE"


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's base directory that every pytest-xdist worker shares (above each worker's own)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def shared_data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data cache for the whole session, in the directory the pytest-xdist workers share."""
    folder = shared_folder(tmp_path_factory) / "data-cache"
    os.environ[DATA_CACHE] = str(folder)
    return folder


# Every RUNS_EVERY-th pair of Tatoeba is what the tests' training runs read (runs_corpus).
RUNS_EVERY = 16


def runs_corpus(corpus: Path) -> Path:
    """The corpus the tests' training runs read in place of `corpus` when that is the real Tatoeba zip
    (another is read as it is): every RUNS_EVERY-th pair of it (short and long alike, since the file is
    sorted by length), written once a session beside the data cache (DATA_CACHE), under a file lock for
    the pytest-xdist workers. A run reads its whole corpus when it starts (to split it
    leak-free and to list its training words), which on all of Tatoeba is most of a smoke run's time,
    and keeps a few hundred pairs of it. The tests of reading and splitting the real corpus, and of
    runs that need more of it, give `dataset.path=<corpus>` themselves."""
    if corpus not in CORPORA:
        return corpus
    folder = Path(os.environ[DATA_CACHE]).parent / "runs-corpus"
    sample = folder / corpus.name
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / "build.lock")):
        if not sample.is_file():
            partial = folder / f".{corpus.name}.partial"
            with zipfile.ZipFile(corpus) as source, zipfile.ZipFile(partial, "w") as out:
                for name in source.namelist():
                    text = source.read(name).decode("utf-8")
                    out.writestr(name, text if name.startswith("_") else
                                 "\n".join(text.split("\n")[::RUNS_EVERY]))
            os.replace(partial, sample)
    return sample


def tiny_overrides(corpus: Path, run_dir: Path, **extra: object) -> list[str]:
    """A training run of seconds: `debug=tiny` (the tiny model, 600 real pairs of runs_corpus(corpus), a
    400-token vocabulary) for two epochs, on one thread, into run_dir, its data from the session's
    cache (DATA_CACHE)."""
    values: dict[str, object] = {
        "debug": "tiny",
        "dataset.path": runs_corpus(corpus),
        "dataset.url": "null",
        "dataset.cache_dir": os.environ.get(DATA_CACHE, run_dir.parent / "cache"),
        "training.epochs": 2,
        "checkpoint.dir": run_dir,
        "device.num_threads": 1,
    }
    values.update(extra)
    return [f"{k}={v}" for k, v in values.items()]


def smoke_overrides(corpus: Path, run_dir: Path, **extra: object) -> list[str]:
    """The smallest run that goes through every part, for tests of plumbing (files, records, wiring) rather
    than of learning: `debug=smoke` (200 real pairs, a 300-token vocabulary), one epoch, into run_dir."""
    return tiny_overrides(corpus, run_dir, **{"debug": "smoke", "training.epochs": 1, **extra})


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` seconds. For waiting on an
    event (a queue length, a log line), never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {timeout} s")
        time.sleep(0.005)


def run_cli(*args: str, input: str | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python -m transformer_mt` as a user would, from the project root."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "transformer_mt", *map(str, args)], cwd=ROOT,
                          input=input, capture_output=True, text=True, timeout=timeout, env=env)


def start_cli(args: list[str], log_file: Path) -> subprocess.Popen:
    """`python -m transformer_mt <args>` started as a user would, its output into log_file (to kill it)."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "transformer_mt", *args], cwd=ROOT, env=env,
                            stdout=log_file.open("w"), stderr=subprocess.STDOUT)


def wait_for_log(log_file: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the run logs `text` (then the caller signals it at once, before it trains much further)."""

    def seen() -> bool:
        if text in log_file.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            raise AssertionError(f"run ended before '{text}':\n{log_file.read_text()[-2000:]}")
        return False

    try:
        wait_until(seen, f"'{text}' in the run's log", timeout)
    except AssertionError:
        proc.kill()
        raise


@pytest.fixture
def run_cli_here(monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> Callable[..., subprocess.CompletedProcess]:
    """`run_cli` in this process: the command line's own entry point (`cli.main`, Hydra and all) and the
    same result (exit code, stdout, stderr), without the seconds a subprocess spends importing torch;
    `input=` is its stdin, as a pipe gives it. For tests of what the command does, not of starting it
    (nor of how a process decodes its arguments or ends). Hydra sets up logging for each job it runs
    and leaves its config behind (which a later job in this process would take for its own): the root
    logger and Hydra's config are given back as they were after each command."""
    from hydra.core.hydra_config import HydraConfig

    from transformer_mt.cli import main

    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main hands Hydra the arguments in sys.argv
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)

    def run(*args: object, input: str | None = None) -> subprocess.CompletedProcess:
        root = logging.getLogger()
        handlers, level, hydra_config = list(root.handlers), root.level, HydraConfig.instance().cfg
        capsys.readouterr()  # the command's output only, as a subprocess's
        if input is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(input.encode()), encoding="utf-8"))
        try:
            code = main([str(a) for a in args])
        except SystemExit as ex:  # the code a process would end with (a message: printed, and 1)
            if ex.code is not None and not isinstance(ex.code, int):
                print(ex.code, file=sys.stderr)
            code = ex.code if isinstance(ex.code, int) else int(ex.code is not None)
        finally:
            for handler in set(root.handlers) - set(handlers):
                handler.close()
            root.handlers[:] = handlers
            root.setLevel(level)
            HydraConfig.instance().cfg = hydra_config
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["transformer-mt", *map(str, args)], code, out, err)

    return run


def _listing(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Iterator[Path]:
    """The tiny run (2 epochs, TensorBoard scalars at every step), trained once through the command line
    as a user would and shared by every test that reads a trained run, in every pytest-xdist worker: the
    first to need it trains it under a file lock in the directory the workers share. Its pairs are drawn
    from the real corpus (not runs_corpus): the tests read this model's own translations and vocabulary,
    and it is trained once. Read only: a test that writes into a run (resumes it, evaluates into it)
    takes `tiny_run_copy`. Checked unchanged at the end."""
    shared = shared_folder(tmp_path_factory)
    run_dir = shared / "tiny-run" / "run"
    with FileLock(str(shared / "tiny-run.lock")):
        if not (run_dir / "result.json").is_file():
            overrides = tiny_overrides(corpus, run_dir, **{"dataset.path": corpus, "training.log_every": 1})
            result = run_cli("train", *overrides)
            assert result.returncode == 0, result.stderr[-3000:]
    before = _listing(run_dir)
    yield run_dir
    assert _listing(run_dir) == before, "a test wrote into the shared tiny_run: use tiny_run_copy"


@pytest.fixture
def tiny_run_copy(tiny_run: Path, tmp_path: Path) -> Path:
    """A copy of tiny_run of this test's own, to resume or write into."""
    return Path(shutil.copytree(tiny_run, tmp_path / "tiny-run"))


@pytest.fixture(scope="module")
def tiny_engine(tiny_run: Path) -> Any:
    """The tiny run's Translator in float32 (a barely trained model has near ties that bf16 could break)."""
    from transformer_mt.decoding.translator import Translator

    return Translator.from_checkpoint(tiny_run, device="cpu", amp="off")


def held_out_pairs(run_dir: Path, n: int) -> tuple[list[str], list[str]]:
    """The first n (source, target) pairs of a run's validation split."""
    from transformer_mt.data import load_split_tsv

    sources, targets = load_split_tsv(run_dir / "split" / "valid.tsv")
    return sources[:n], targets[:n]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first (LONGEST_FIRST), the rest in their order: two workers end together."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
