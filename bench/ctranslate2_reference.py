"""The reference rows of bench/decode.py: CTranslate2, a C++ inference engine for Transformers,
running our model's own weights (export/ctranslate2.py converts them), so that a ratio is
measured in one run on one set of weights. Token i is named `<i>` in its vocabulary, with our
padding, unknown, begin- and end-of-sentence ids at 0-3; sources carry their own end of sentence.

CTranslate2 is an optional dependency (`pip install -r export/requirements.txt`); without it
the rows are skipped with a message.
"""

import os
import subprocess
import sys

from export import ctranslate2 as conversion
from export.ctranslate2 import available  # noqa: F401  (bench/decode.py and real_serving.py ask it)
from keras_transformer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SPECIAL = {PAD_ID: "<blank>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}


def token(i):
    return SPECIAL.get(i, f"<{i}>")


def convert(model, directory, candidates=None):
    """Writes `model` as a CTranslate2 model in `directory`, its tokens named by `token`, with
    `candidates` (ids) as the always list of a vocabulary map (`translate(..., use_vmap=True)`);
    returns the directory."""
    vocabulary = [token(i) for i in range(model.config.vocab_size)]
    files = {}
    if candidates is not None:
        os.makedirs(directory, exist_ok=True)
        files["vmap.txt"] = _vocabulary_map(os.path.join(directory, "candidates.txt"), candidates)
    return conversion.convert(model, directory, vocabulary, add_source_eos=False, files=files)


def convert_opus_mt(release, directory, candidates=None):
    """The OPUS-MT release folder `release` (its pieces named by `token` of our ids:
    bench/decode.py's `--marian`) converted by CTranslate2's own OpusMTConverter into
    `directory`, with `candidates` as `convert`'s; returns the directory. The converted model
    appends the end of sentence to each source itself."""
    from ctranslate2.converters import OpusMTConverter

    OpusMTConverter(release).convert(directory, force=True)
    if candidates is not None:
        _vocabulary_map(os.path.join(directory, "vmap.txt"), candidates)
    return directory


def _vocabulary_map(path, candidates):
    """Writes CTranslate2's vocabulary map of `candidates` (ids) for every source; returns `path`."""
    with open(path, "w") as f:
        f.write("\t" + " ".join(token(int(i)) for i in candidates) + "\n")
    return path


# CTranslate2 multiplies matrices with Intel MKL on Intel CPUs and with oneDNN elsewhere
# (CT2_USE_MKL overrides it). On one Xeon here MKL ran beam 4 one sentence at a time at 10
# sentences/s against 130 with oneDNN (the multi30k model of bench/README.md): the reference takes
# the faster, measured on the machine it runs on.
_TIME_BACKEND = """
import sys, time, ctranslate2
translator = ctranslate2.Translator(sys.argv[1], device="cpu", compute_type="float32", intra_threads=int(sys.argv[2]))
source = [["<%d>" % (4 + i % 50) for i in range(12)] + ["</s>"]]
translator.translate_batch(source, beam_size=4, max_decoding_length=20)
start = time.perf_counter()
for _ in range(20):
    translator.translate_batch(source, beam_size=4, max_decoding_length=20)
print(time.perf_counter() - start)
"""


def choose_backend(directory):
    """Sets CT2_USE_MKL, unless the user did, to whichever of MKL ("1") and oneDNN ("0") runs the
    converted model in `directory` faster here (20 single-sentence beam searches each, in fresh
    processes: the choice is read when CTranslate2 loads); returns the value. Call it before this
    process imports ctranslate2; workers started afterwards inherit it."""
    if "CT2_USE_MKL" not in os.environ:
        seconds = {}
        for value in ("1", "0"):
            command = [sys.executable, "-c", _TIME_BACKEND, directory, str(os.cpu_count())]
            result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "CT2_USE_MKL": value},
                                    timeout=600)  # fmt: skip
            seconds[value] = float(result.stdout.split()[-1]) if result.returncode == 0 else float("inf")
        os.environ["CT2_USE_MKL"] = min(seconds, key=seconds.get)
    return os.environ["CT2_USE_MKL"]


def translator(directory, compute_type="default"):
    """A CTranslate2 translator of the model in `directory` on this machine's CPUs, as every
    benchmark runs it: one translation at a time on all cores; "default" computes in the
    model's own weight type."""
    import ctranslate2

    return ctranslate2.Translator(directory, device="cpu", compute_type=compute_type, inter_threads=1,
                                  intra_threads=os.cpu_count())  # fmt: skip


def translate(translator, source_ids, beam_size, length, forced=False, use_vmap=False):
    """(output ids, log-probabilities) for int `source_ids` `[batch, source_len]` (no padding),
    at most `length` tokens each; with `forced`, exactly `length` (end-of-sentence suppressed
    before), as bench/decode.py times our search. No length penalty."""
    source = [[token(int(i)) for i in row] for row in source_ids]
    lengths = dict(max_decoding_length=length, min_decoding_length=length if forced else 1)
    results = translator.translate_batch(source, beam_size=beam_size, length_penalty=0.0, return_scores=True,
                                         use_vmap=use_vmap, **lengths)  # fmt: skip
    ids = {token(i): i for i in SPECIAL}
    tokens = [[ids[t] if t in ids else int(t[1:-1]) for t in result.hypotheses[0]] for result in results]
    return tokens, [result.scores[0] for result in results]
