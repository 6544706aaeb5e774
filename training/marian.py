"""Marian's Transformer (the OPUS-MT models) read into a `Transformer`: its options from the
model's own config, its weights by their Marian names, its vocabulary in this project's ids.

Marian's model is the paper's post-norm Transformer (`--transformer-postprocess dan`) with the
options TransformerConfig has for it: the swish activation, a sine half and a cosine half of the
sinusoids, a bias on the logits. Its vocabulary has the end of sentence at id 0 and the unknown
token at id 1, and its decoder starts from a zero vector, not a token. Here the vocabulary takes
this project's layout (keras_transformer/common.py: padding 0, unknown 1, begin 2, end 3) by
two new rows, padding's and the begin of sentence's, both zero vectors, and the begin of
sentence's logit bias `NEG_INF` (Marian has no such token to output):

    ours:   0 padding (new)   1 <unk>   2 begin (new)   3 </s>   4, 5, ... Marian's 2, 3, ...

so that the searches, serving and training read an imported model as one of their own, with
no setting of its own. The translations and scores are Marian's: a zero vector scaled by
sqrt(d_model) is still zero, and a logit of `NEG_INF` takes no probability
(tests/test_marian.py checks them against Marian's Transformer written out in NumPy).
"""

import numpy as np
import yaml

from keras_transformer.common import BOS_ID, EOS_ID, NEG_INF, PAD_ID, UNK_ID
from keras_transformer.config import TransformerConfig

MARIAN_EOS, MARIAN_UNK = 0, 1  # Marian's ids of </s> and <unk>
NEW_ROWS = 2  # padding and the begin of sentence
LAYER_NORM_EPSILON = 1e-6  # Marian's transformer layers' (its layerNorm's own default is 1e-9)
MAX_LENGTH = 512  # the longest source served, for a model whose config names none


def our_id(marian_id):
    """The id in this project's layout of Marian's `marian_id` (an int or an int array)."""
    marian_id = np.asarray(marian_id)
    return np.where(marian_id == MARIAN_EOS, EOS_ID, np.where(marian_id == MARIAN_UNK, UNK_ID, marian_id + NEW_ROWS))


def vocabulary_in_our_ids(pieces):
    """Marian's vocabulary (the piece of each of its ids) as ours: `len(pieces) + 2` pieces,
    padding's and the begin of sentence's named `<pad>` and `<s>`."""
    ours = [""] * (len(pieces) + NEW_ROWS)
    for marian_id, piece in enumerate(pieces):
        ours[int(our_id(marian_id))] = piece
    ours[PAD_ID], ours[BOS_ID] = "<pad>", "<s>"
    return ours


def read_vocabulary(path):
    """The pieces of a Marian vocabulary file (`*.vocab.yml`: `piece: id` a line), by id.

    Read line by line, not as YAML: a plain piece such as `yes` or `1` is a string here, which
    a YAML reader would turn into a boolean or a number. A quoted piece is unquoted as YAML does;
    a piece on a line `? piece` has its id on the next line `: id`.
    """
    found, key = {}, None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if line.startswith("? "):
                key = line[2:]
                continue
            if key is not None:
                piece, value = key, line.removeprefix(":").strip()
                key = None
            else:
                piece, _, value = line.rpartition(":")
            if piece[:1] in ("'", '"'):
                piece = yaml.safe_load(piece)
            try:
                found[int(value)] = piece
            except ValueError:
                raise ValueError(f"{path}, line {number}: {line!r} is not `piece: id`.") from None
    if sorted(found) != list(range(len(found))):
        raise ValueError(f"{path}: the ids are not 0 to {len(found) - 1} each once.")
    if (found.get(MARIAN_EOS), found.get(MARIAN_UNK)) != ("</s>", "<unk>"):
        raise ValueError(f"{path}: ids 0 and 1 are {found.get(0)!r} and {found.get(1)!r}, not Marian's </s> and <unk>.")
    return [found[i] for i in range(len(found))]


def model_options(weights, path):
    """The training options Marian stores in the model (`special:model.yml`), as a dict."""
    if "special:model.yml" not in weights:
        raise ValueError(f"{path} has no special:model.yml: it is not a model that Marian saved.")
    return yaml.safe_load(weights["special:model.yml"].tobytes().rstrip(b"\0"))


def config_from_options(options, vocab_size, path):
    """The `TransformerConfig` of a Marian model's `options` and its vocabulary's size (Marian's:
    the config's is 2 more). Refuses what this project's model cannot compute."""
    required = {"type": "transformer", "transformer-preprocess": "", "transformer-postprocess": "dan",
                "transformer-decoder-autoreg": "self-attention", "tied-embeddings-all": True}  # fmt: skip
    for name, value in required.items():
        if options.get(name, value) != value:
            raise ValueError(f"{path}: Marian's --{name} is {options[name]!r}; only {value!r} can be imported.")
    if options.get("transformer-postprocess-emb", "d") not in ("", "d"):
        raise ValueError(f"{path}: Marian's --transformer-postprocess-emb {options['transformer-postprocess-emb']!r} "
                         "normalises the embeddings; only '' or 'd' can be imported.")  # fmt: skip
    activation = options.get("transformer-ffn-activation", "swish")
    if activation not in ("swish", "relu"):
        raise ValueError(f"{path}: Marian's --transformer-ffn-activation {activation!r}: only swish or relu.")
    return TransformerConfig(
        vocab_size=vocab_size + NEW_ROWS,
        encoder_layers=int(options["enc-depth"]),
        decoder_layers=int(options["dec-depth"]),
        d_model=int(options["dim-emb"]),
        num_heads=int(options["transformer-heads"]),
        d_ff=int(options["transformer-dim-ffn"]),
        dropout=float(options.get("transformer-dropout", 0.1)),
        attention_dropout=float(options.get("transformer-dropout-attention", 0.0)),
        relu_dropout=float(options.get("transformer-dropout-ffn", 0.0)),
        positional_encoding="sinusoidal_halves",
        activation=activation,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        logits_bias=True,
        max_length=int(options.get("max-length") or MAX_LENGTH),
    )


class _Weights:
    """A Marian model's arrays by name, each taken once and checked against the shape ours has."""

    def __init__(self, weights, path):
        self.weights, self.path = weights, path

    def take(self, name, shape):
        if name not in self.weights:
            raise ValueError(f"{self.path} has no tensor {name}: not a Marian Transformer of its own config.")
        value = np.asarray(self.weights[name], np.float32)
        if value.size != int(np.prod(shape)):
            raise ValueError(f"{self.path}: {name} has shape {value.shape}; the config gives {tuple(shape)}.")
        return value.reshape(shape)


def load_marian(model_path, vocabulary_path):
    """A `Transformer` of the Marian model in `model_path` (`.npz`) and its vocabulary
    (`*.vocab.yml`); returns (the model, its pieces in our ids)."""
    from keras_transformer.model import Transformer

    pieces = read_vocabulary(vocabulary_path)
    with np.load(model_path) as npz:
        weights = {name: npz[name] for name in npz.files}
    config = config_from_options(model_options(weights, model_path), len(pieces), model_path)
    model = Transformer(config)
    marian = _Weights(weights, model_path)
    d, vocab = config.d_model, len(pieces)

    embedding = np.zeros((config.vocab_size, d), np.float32)  # padding's and the begin's rows stay zero
    embedding[our_id(np.arange(vocab))] = marian.take("Wemb", (vocab, d))
    bias = np.zeros((config.vocab_size,), np.float32)
    bias[our_id(np.arange(vocab))] = marian.take("decoder_ff_logit_out_b", (vocab,))
    bias[BOS_ID] = NEG_INF
    model.embedding.embeddings.assign(embedding)
    model.embedding.bias.assign(bias)
    for number, layer in enumerate(model.encoder.layers, 1):
        _attention(marian, f"encoder_l{number}_self", layer.self_attention, layer.self_attention_norm)
        _feed_forward(marian, f"encoder_l{number}_ffn", layer.feed_forward, layer.feed_forward_norm)
    for number, layer in enumerate(model.decoder.layers, 1):
        _attention(marian, f"decoder_l{number}_self", layer.self_attention, layer.self_attention_norm)
        _attention(marian, f"decoder_l{number}_context", layer.cross_attention, layer.cross_attention_norm)
        _feed_forward(marian, f"decoder_l{number}_ffn", layer.feed_forward, layer.feed_forward_norm)
    return model, vocabulary_in_our_ids(pieces)


def _norm(marian, scope, norm):
    norm.gamma.assign(marian.take(f"{scope}_ln_scale", norm.gamma.shape))
    norm.beta.assign(marian.take(f"{scope}_ln_bias", norm.beta.shape))


def _attention(marian, scope, attention, norm):
    """Marian's W (`[in, out]`) and b of q, k, v, o; ours split the heads out of the same order."""
    for name, kernel, bias in (("q", attention.query_kernel, attention.query_bias),
                               ("k", attention.key_kernel, attention.key_bias),
                               ("v", attention.value_kernel, attention.value_bias),
                               ("o", attention.output_kernel, attention.output_bias)):  # fmt: skip
        kernel.assign(marian.take(f"{scope}_W{name}", kernel.shape))
        bias.assign(marian.take(f"{scope}_b{name}", bias.shape))
    _norm(marian, f"{scope}_Wo", norm)


def _feed_forward(marian, scope, feed_forward, norm):
    for number, dense in ((1, feed_forward.inner), (2, feed_forward.outer)):
        dense.kernel.assign(marian.take(f"{scope}_W{number}", dense.kernel.shape))
        dense.bias.assign(marian.take(f"{scope}_b{number}", dense.bias.shape))
    _norm(marian, f"{scope}_ffn", norm)
