"""What tests of the searches share: small random models, sources, the brute-force references'
forward pass and length penalty, and a model double that moves the end-of-sentence logit."""

import functools

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import EOS_ID, PAD_ID, Transformer, TransformerConfig


def _model(vocab_size, seed=3, **overrides):
    keras.utils.set_random_seed(seed)
    values = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.0)
    return Transformer(TransformerConfig.tiny(vocab_size, **{**values, **overrides}))


@functools.cache
def _forward(model):
    """`model((source_ids, target_inputs))` (int32 `[batch, length]` each) as one TensorFlow
    graph for any shapes, for the brute-force references' many full forward passes: a call costs
    about a thirtieth of Keras' eager call on these models."""
    spec = tf.TensorSpec([None, None], tf.int32)
    return tf.function(lambda source, target: model((source, target)), autograph=False, input_signature=[spec, spec])


def _length_penalty(length, alpha):
    """GNMT's `lp(Y) = ((5 + |Y|) / 6) ** alpha` (Wu et al., 2016; the paper's decoding), in
    plain Python for the references: independent of the library's, and free of a TensorFlow op a
    hypothesis."""
    return ((5.0 + length) / 6.0) ** alpha


def _sources(rng, lengths, vocab_size):
    ids = np.zeros((len(lengths), max(lengths)), "int32")
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(4, vocab_size, size=length)
    return ids


class _EosLogit:
    """A `DecodingModel` that wraps a model and adds `adjust(index, source_length, slot)` to the
    EOS logit at each step.

    A row is known by its sentence's source length and its place among the sentence's
    hypotheses (float `[rows]` each), not by its row number, which changes when beam search
    stops decoding sentences that are done. The cache carries the source lengths beside the
    model's, and keeps them for the sentences that stay."""

    def __init__(self, model, adjust):
        self.model, self.config, self.adjust, self.encode = model, model.config, adjust, model.encode

    def init_cache(self, encoder_output, source_mask, hypotheses=1, max_length=None, shared_slots=True):
        self.hypotheses = hypotheses
        source_length = tf.reduce_sum(tf.cast(source_mask[:, 0], tf.float32), axis=1)  # [sentences]
        return self.model.init_cache(encoder_output, source_mask, hypotheses, max_length, shared_slots), source_length

    def decode_step(self, token_ids, index, cache):
        model_cache, source_length = cache
        logits, model_cache = self.model.decode_step(token_ids, index, model_cache)
        rows_length = tf.repeat(source_length, self.hypotheses)
        slot = tf.cast(tf.range(tf.shape(token_ids)[0]) % self.hypotheses, tf.float32)
        adjust = tf.cast(self.adjust(index, rows_length, slot), tf.float32) + tf.zeros_like(rows_length)
        return logits + tf.one_hot(EOS_ID, logits.shape[-1]) * adjust[:, None], (model_cache, source_length)

    def reorder_cache(self, cache, parents, sentences=None):
        model_cache, source_length = cache
        model_cache = self.model.reorder_cache(model_cache, parents, sentences)
        return model_cache, source_length if sentences is None else tf.gather(source_length, sentences)


def _never_ends(model):
    return _EosLogit(model, lambda index, source_length, slot: -1e4)


def _ends_at(model, length):
    return _EosLogit(model, lambda index, source_length, slot: tf.where(index + 1 == length, 1e4, -1e4))


def _nonzero_lengths(tokens):
    return np.sum(np.asarray(tokens) != PAD_ID, axis=-1)
