"""`python -m export.ctranslate2 --run-dir DIR --out OUT [--quantization int8] [--checkpoint best]`:
the run's model as a model directory of CTranslate2, a C++ inference engine for Transformers
(int8 matrix products on CPUs, which stock TensorFlow lacks), with the run's SentencePiece model.

The weights map one to one: our post-norm layers are its `pre_norm=False` layers (each stack of
its own depth), W^Q, W^K, W^V fused as it stores them, the shared embedding (scaled by
sqrt(d_model)) as both embeddings and the output projection, and our position table (the
sinusoids in either layout, or the learned one) as its position encodings, the feed-forward
activation, the LayerNorms' epsilon and the logits' bias. Its vocabulary is the SentencePiece
pieces, so the usual recipe translates (export/README.md):

    pieces = sentencepiece.SentencePieceProcessor(model_file="OUT/sentencepiece.model")
    results = ctranslate2.Translator("OUT").translate_batch(pieces.encode(texts, out_type=str))
    translations = pieces.decode([result.hypotheses[0] for result in results])

What the model needs beyond the pieces is in the converted model's config.json: the source's
end-of-sentence token, which our encoder reads last (`add_source_eos`); and the output
projection's bias keeps padding from being generated, as our logits do.
"""

import argparse
import contextlib
import os
import shutil
import sys

import numpy as np

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()

import tensorflow as tf  # noqa: E402

from keras_transformer.common import PAD_ID  # noqa: E402
from keras_transformer.positional_encoding import sinusoids  # noqa: E402

QUANTIZATIONS = ("float32", "int8", "int8_float32")  # CTranslate2's weight types here (int8: int8 products)
SINUSOID_POSITIONS = 1024  # rows of a sinusoid table: CTranslate2's default max_input_length
PADDING_LOGIT = -1e4  # padding's bias on the logits: never generated, and finite in float16
INSTALL = "pip install -r export/requirements.txt"


def available():
    """Whether the ctranslate2 package can be imported."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False
    return True


def convert(model, directory, vocabulary, quantization="float32", add_source_eos=True, files=None,
            source_vocabulary=None):
    """Writes `model` (a `Transformer`) as a CTranslate2 model in `directory`; returns it.

    Args:
        vocabulary: the token of each id, `config.vocab_size` strings; ids 1, 2 and 3 (unknown,
            begin and end of sentence) are CTranslate2's `<unk>`, `<s>` and `</s>`.
        source_vocabulary: the source's, `config.source_vocab_size` strings, for a model with a
            source vocabulary of its own (else the source's is `vocabulary`).
        quantization: one of `QUANTIZATIONS`, the stored weights' type.
        add_source_eos: whether CTranslate2 appends `</s>` to each source (False for callers
            that pass it themselves).
        files: {name: path} of files copied into the model directory (the SentencePiece model).
    """
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"--quantization {quantization!r}: choose {', '.join(QUANTIZATIONS)}.")
    if len(vocabulary) != config.vocab_size:
        raise ValueError(f"The vocabulary has {len(vocabulary)} tokens; the model has {config.vocab_size}.")
    source_size = config.source_vocab_size or config.vocab_size
    source_vocabulary = vocabulary if config.source_vocab_size is None else source_vocabulary
    if source_vocabulary is None or len(source_vocabulary) != source_size:
        given = "none" if source_vocabulary is None else len(source_vocabulary)
        raise ValueError(f"The model's source vocabulary has {source_size} tokens; the one given has {given}.")
    activation = {"relu": common_spec.Activation.RELU, "swish": common_spec.Activation.SWISH}[config.activation]
    spec = transformer_spec.TransformerSpec.from_config((config.encoder_layers, config.decoder_layers), config.num_heads,
                                                        pre_norm=False, activation=activation)  # fmt: skip
    spec.config.layer_norm_epsilon = config.layer_norm_epsilon
    spec.config.add_source_eos = add_source_eos
    embedding = _numpy(model.embedding.embeddings)
    if model.positional_encoding.learned:
        table = _numpy(model.positional_encoding.table)
    else:
        positions = np.arange(max(SINUSOID_POSITIONS, config.max_length))
        table = np.asarray(sinusoids(positions, config.d_model, model.positional_encoding.halves), np.float32)
    for stack_spec in (spec.encoder, spec.decoder):
        stack_spec.position_encodings.encodings = table
    separate = model.source_embedding is not None
    spec.encoder.embeddings[0].weight = _numpy(model.source_embedding.embeddings) if separate else embedding
    spec.decoder.embeddings.weight = embedding
    spec.decoder.projection.weight = embedding  # logits = x E^T
    bias = _numpy(model.embedding.bias_or_zeros())  # with padding's, never generated
    spec.decoder.projection.bias = np.where(np.arange(config.vocab_size) == PAD_ID, PADDING_LOGIT, bias).astype("float32")
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.layers):
        _attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_norm, fused=True)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_norm)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.layers):
        _attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_norm, fused=True)
        _attention(layer_spec.attention, layer.cross_attention, layer.cross_attention_norm, fused=False)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_norm)
    spec.register_source_vocabulary(list(source_vocabulary))
    spec.register_target_vocabulary(list(vocabulary))
    for name, path in (files or {}).items():
        spec.register_file(path, name)
    spec.validate()
    spec.optimize(quantization=quantization)
    os.makedirs(directory, exist_ok=True)
    spec.save(directory)
    return directory


def export(run_dir, out, quantization="float32", checkpoint=None):
    """Converts the run in `run_dir` (its `checkpoint`, default as `python -m export`'s) into the
    new folder `out`, through a staging folder renamed into place; returns `out`. The run's
    shortlist (training/shortlist.py), if it has one, becomes CTranslate2's vocabulary map
    (`vmap.txt`: `translate_batch(..., use_vmap=True)`)."""
    from training.run_folder import RunFolder, local_copy

    if os.path.exists(out) and os.listdir(out):
        raise ValueError(f"--out {out} exists and is not empty: give a new folder.")
    run = RunFolder(run_dir)
    model, checkpoint = run.load_model(checkpoint)
    staging = f"{out.rstrip(os.sep)}.partial"
    shutil.rmtree(staging, ignore_errors=True)  # what an interrupted conversion left
    shortlist = tf.io.gfile.exists(run.shortlist_path)
    tokenizer = run.load_tokenizer()
    with contextlib.ExitStack() as stack:
        files = {"sentencepiece.model": stack.enter_context(local_copy(run.tokenizer_path))}
        if not tokenizer.shared:
            files["target_sentencepiece.model"] = stack.enter_context(local_copy(run.target_tokenizer_path))
        if shortlist:
            files["vmap.txt"] = stack.enter_context(local_copy(run.shortlist_path))
        source_vocabulary = tokenizer.source.piece_list() if model.config.source_vocab_size else None
        convert(model, staging, tokenizer.target.piece_list(), quantization, files=files, source_vocabulary=source_vocabulary)
    if os.path.exists(out):
        os.rmdir(out)
    os.rename(staging, out)
    print(f"Converted {checkpoint} ({quantization}{', with its shortlist as vmap.txt' if shortlist else ''}) to {out}",
          flush=True)  # fmt: skip
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="a run folder of training.train")
    parser.add_argument("--out", required=True, help="the CTranslate2 model directory to write (new or empty)")
    parser.add_argument("--quantization", default="float32", choices=QUANTIZATIONS,
                        help="the stored weights' type: int8 for int8 matrix products on CPUs")  # fmt: skip
    parser.add_argument("--checkpoint", help="latest, a step, averaged, best, or a checkpoint's path (default: averaged "
                        "while it is the newest, else latest)")  # fmt: skip
    args = parser.parse_args(argv)
    if not available():
        sys.exit(f"error: the CTranslate2 export needs the ctranslate2 package: {INSTALL}")
    try:
        export(args.run_dir, args.out, args.quantization, args.checkpoint)
    except ValueError as error:
        sys.exit(f"error: {error}")


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


if __name__ == "__main__":
    main()
