"""The reference rows of bench/decode.py: CTranslate2, a C++ inference engine for Transformers,
running our model's own weights, so that a ratio is measured in one run on one set of weights.

CTranslate2 is a bench-only, optional dependency (`pip install -r bench/requirements.txt`);
without it the rows are skipped with a message. The weights map one to one: our post-norm
layers are its `pre_norm=False` layers, W^Q, W^K, W^V fused as it stores them, the shared
embedding (scaled by sqrt(d_model)) as both embeddings and the output projection, and our
sinusoid table as its position encodings. Token i is named `<i>` in its vocabulary, with our
padding, unknown, begin- and end-of-sentence ids at 0-3.
"""

import os
import subprocess
import sys

import numpy as np

from keras_transformer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from keras_transformer.positional_encoding import sinusoids
from keras_transformer.residual import LAYER_NORM_EPSILON

MAX_POSITIONS = 1024  # rows of the position table (sources and outputs are shorter)
SPECIAL = {PAD_ID: "<blank>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}


def available():
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False
    return True


def token(i):
    return SPECIAL.get(i, f"<{i}>")


def convert(model, directory):
    """Writes `model` (a `Transformer` with sinusoidal positions) as a CTranslate2 model in
    `directory`; returns the directory."""
    from ctranslate2.specs import transformer_spec

    config = model.config
    spec = transformer_spec.TransformerSpec.from_config((config.encoder_layers, config.decoder_layers), config.num_heads, pre_norm=False)
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    embedding = _numpy(model.embedding.embeddings)
    table = np.asarray(sinusoids(np.arange(MAX_POSITIONS), config.d_model), np.float32)
    for stack_spec in (spec.encoder, spec.decoder):
        stack_spec.position_encodings.encodings = table
    spec.encoder.embeddings[0].weight = embedding
    spec.decoder.embeddings.weight = embedding
    spec.decoder.projection.weight = embedding  # logits = x E^T, no bias
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.layers):
        _attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_norm, fused=True)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_norm)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.layers):
        _attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_norm, fused=True)
        _attention(layer_spec.attention, layer.cross_attention, layer.cross_attention_norm, fused=False)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_norm)
    vocabulary = [token(i) for i in range(config.vocab_size)]
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    spec.validate()
    spec.optimize(quantization="float32")
    os.makedirs(directory, exist_ok=True)
    spec.save(directory)
    return directory


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


def translator(directory):
    import ctranslate2

    return ctranslate2.Translator(directory, device="cpu", compute_type="float32", inter_threads=1,
                                  intra_threads=os.cpu_count())  # fmt: skip


def translate(translator, source_ids, beam_size, length, forced=False):
    """(output ids, log-probabilities) for int `source_ids` `[batch, source_len]` (no padding),
    at most `length` tokens each; with `forced`, exactly `length` (end-of-sentence suppressed
    before), as bench/decode.py times our search. No length penalty."""
    source = [[token(int(i)) for i in row] for row in source_ids]
    lengths = dict(max_decoding_length=length, min_decoding_length=length if forced else 1)
    results = translator.translate_batch(source, beam_size=beam_size, length_penalty=0.0, return_scores=True,
                                         suppress_sequences=[[token(PAD_ID)]], **lengths)  # fmt: skip
    ids = {token(i): i for i in SPECIAL}
    tokens = [[ids[t] if t in ids else int(t[1:-1]) for t in result.hypotheses[0]] for result in results]
    return tokens, [result.scores[0] for result in results]


def _numpy(variable):
    return np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable, np.float32)


def _linear(spec, kernel, bias):
    """Ours: kernel [in, ...out], bias [...out]; CTranslate2's: weight [out, in], bias [out]."""
    kernel = _numpy(kernel)
    spec.weight = np.ascontiguousarray(kernel.reshape(kernel.shape[0], -1).T)
    spec.bias = _numpy(bias).reshape(-1)


def _norm(spec, norm):
    spec.gamma, spec.beta = _numpy(norm.gamma), _numpy(norm.beta)


def _attention(spec, attention, norm, fused):
    heads, key_dim = attention.num_heads, attention.key_dim
    projections = []
    for kernel, bias in ((attention.query_kernel, attention.query_bias), (attention.key_kernel, attention.key_bias),
                         (attention.value_kernel, attention.value_bias)):  # fmt: skip
        projections.append((_numpy(kernel).reshape(-1, heads * key_dim), _numpy(bias).reshape(-1)))
    groups = [projections] if fused else [projections[:1], projections[1:]]
    for linear_spec, group in zip(spec.linear, groups):
        linear_spec.weight = np.ascontiguousarray(np.concatenate([k for k, _ in group], axis=1).T)
        linear_spec.bias = np.concatenate([b for _, b in group])
    output_kernel = _numpy(attention.output_kernel).reshape(heads * key_dim, -1)
    spec.linear[-1].weight = np.ascontiguousarray(output_kernel.T)
    spec.linear[-1].bias = _numpy(attention.output_bias)
    _norm(spec.layer_norm, norm)


def _feed_forward(spec, feed_forward, norm):
    _linear(spec.linear_0, feed_forward.inner.kernel, feed_forward.inner.bias)
    _linear(spec.linear_1, feed_forward.outer.kernel, feed_forward.outer.bias)
    _norm(spec.layer_norm, norm)
