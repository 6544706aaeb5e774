"""Marian's Transformer (the OPUS-MT models) read into a `Transformer`: its options from the
model's own config, its weights by their Marian names, its vocabulary in this project's ids.
Either of its two published forms (`read_model`): Marian's release folder (`model.npz` with its
`special:model.yml`, `*.vocab.yml`), or Hugging Face's (`config.json` of model_type marian,
`model.safetensors` or, where torch is installed, `pytorch_model.bin`, `vocab.json`, and
`target_vocab.json` for a model of two vocabularies), whose tensors are renamed to Marian's on
reading.

Marian's model is the paper's post-norm Transformer (`--transformer-postprocess dan`) with the
options TransformerConfig has for it: the swish activation, a sine half and a cosine half of the
sinusoids, a bias on the logits, and a source vocabulary of its own where the model has one
(`--tied-embeddings` without `-all`: the output projection tied to the target's embedding). Its
vocabulary has the end of sentence at id 0 and the unknown token at id 1, and its decoder starts
from a zero vector, not a token. Here the vocabulary takes
this project's layout (keras_transformer/common.py: padding 0, unknown 1, begin 2, end 3) by
two new rows, padding's and the begin of sentence's, both zero vectors, and the begin of
sentence's logit bias `NEG_INF` (Marian has no such token to output):

    ours:   0 padding (new)   1 <unk>   2 begin (new)   3 </s>   4, 5, ... Marian's 2, 3, ...

so that the searches, serving and training read an imported model as one of their own, with
no setting of its own. The translations and scores are Marian's: a zero vector scaled by
sqrt(d_model) is still zero, and a logit of `NEG_INF` takes no probability
(tests/test_marian.py checks them against Marian's Transformer written out in NumPy).
"""

import glob
import json
import os

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


def marian_id(our):
    """Marian's id of our id `our` (an int or an int array; not padding or the begin of sentence,
    which Marian lacks): `our_id`'s inverse."""
    our = np.asarray(our)
    return np.where(our == EOS_ID, MARIAN_EOS, np.where(our == UNK_ID, MARIAN_UNK, our - NEW_ROWS))


def vocabulary_in_our_ids(pieces):
    """Marian's vocabulary (the piece of each of its ids) as ours: `len(pieces) + 2` pieces,
    padding's and the begin of sentence's named `<pad>` and `<s>`."""
    ours = [""] * (len(pieces) + NEW_ROWS)
    for i, piece in zip(our_id(np.arange(len(pieces))), pieces):
        ours[i] = piece
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
    return pieces_by_id(found, path)


def model_options(weights, path):
    """The training options Marian stores in the model (`special:model.yml`), as a dict."""
    if "special:model.yml" not in weights:
        raise ValueError(f"{path} has no special:model.yml: it is not a model that Marian saved.")
    return yaml.safe_load(weights["special:model.yml"].tobytes().rstrip(b"\0"))


def config_from_options(options, source_size, target_size, path):
    """The `TransformerConfig` of a Marian model's `options` and its vocabularies' sizes (Marian's:
    the config's are 2 more; the same vocabulary twice when the model has one). Refuses what this
    project's model cannot compute."""
    required = {"type": "transformer", "transformer-preprocess": "", "transformer-postprocess": "dan",
                "transformer-decoder-autoreg": "self-attention"}  # fmt: skip
    if not options.get("tied-embeddings-all", True) and not options.get("tied-embeddings", False):
        raise ValueError(f"{path}: Marian's --tied-embeddings is False: an output projection of its own cannot be "
                         "imported, only one tied to the target's embedding.")  # fmt: skip
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
        vocab_size=target_size + NEW_ROWS,
        source_vocab_size=None if options.get("tied-embeddings-all", True) else source_size + NEW_ROWS,
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
    """A model's arrays by name, each taken checked against the shape ours has (if given)."""

    def __init__(self, weights, path):
        self.weights, self.path = weights, path

    def take(self, name, shape=None):
        if name not in self.weights:
            raise ValueError(f"{self.path} has no tensor {name}: not a Marian Transformer of its own config.")
        value = np.asarray(self.weights[name], np.float32)
        if shape is None:
            return value
        if value.size != int(np.prod(shape)):
            raise ValueError(f"{self.path}: {name} has shape {value.shape}; the config gives {tuple(shape)}.")
        return value.reshape(shape)


def read_model(folder):
    """(weights by Marian's names, Marian's options, the source's and the target's pieces by
    Marian's id, the file the weights came from) of an OPUS-MT model in either form in `folder`."""
    if os.path.exists(os.path.join(folder, "config.json")):
        return read_hugging_face(folder)
    models = sorted(glob.glob(os.path.join(folder, "*.npz")))
    vocabularies = sorted(glob.glob(os.path.join(folder, "*.vocab.yml")))
    decoder = os.path.join(folder, "decoder.yml")
    if os.path.exists(decoder):  # the release's own choice of model and vocabularies
        with open(decoder, encoding="utf-8") as f:
            chosen = yaml.safe_load(f)
        models = [os.path.join(folder, chosen["models"][0])]
        vocabularies = [os.path.join(folder, name) for name in chosen["vocabs"]]
    if not models or not vocabularies:
        raise ValueError(f"{folder}: neither config.json (Hugging Face's form) nor a model .npz with a .vocab.yml "
                         "(Marian's).")  # fmt: skip
    with np.load(models[0]) as npz:
        weights = {name: npz[name] for name in npz.files}
    source = read_vocabulary(vocabularies[0])
    target = source if vocabularies[-1] == vocabularies[0] else read_vocabulary(vocabularies[-1])
    return weights, model_options(weights, models[0]), source, target, models[0]


def read_hugging_face(folder):
    """`read_model` for Hugging Face's form: its config as Marian's options, its tensors under
    Marian's names (torch's Linear weights `[out, in]` transposed to Marian's `[in, out]`), its
    vocabulary without the padding Hugging Face appends (the decoder's zero start)."""
    config_path = os.path.join(folder, "config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    if config.get("model_type") != "marian":
        raise ValueError(f"{config_path}: model_type {config.get('model_type')!r}: only marian can be imported.")
    path = os.path.join(folder, "model.safetensors")
    if os.path.exists(path):
        from safetensors.numpy import load_file

        tensors = load_file(path)
    elif os.path.exists(os.path.join(folder, "pytorch_model.bin")):
        path = os.path.join(folder, "pytorch_model.bin")
        tensors = _torch_tensors(path, folder)
    else:
        raise ValueError(f"{folder} has neither model.safetensors nor pytorch_model.bin.")
    for name, value in (("encoder_attention_heads", config.get("decoder_attention_heads")),
                        ("encoder_ffn_dim", config.get("decoder_ffn_dim"))):  # fmt: skip
        if config.get(name) != value:
            raise ValueError(f"{config_path}: {name} {config.get(name)} differs from the decoder's {value}.")
    required = {"normalize_before": False, "scale_embedding": True, "tie_word_embeddings": True}
    for name, value in required.items():
        if config.get(name, value) != value:
            raise ValueError(f"{config_path}: {name} {config[name]!r}; only {value!r} can be imported.")
    activation = config["activation_function"]
    options = {"type": "transformer", "dim-emb": config["d_model"], "enc-depth": config["encoder_layers"],
               "dec-depth": config["decoder_layers"], "transformer-heads": config["encoder_attention_heads"],
               "transformer-dim-ffn": config["encoder_ffn_dim"],
               "transformer-ffn-activation": "swish" if activation == "silu" else activation,
               "transformer-dropout": config.get("dropout", 0.1),
               "transformer-dropout-attention": config.get("attention_dropout", 0.0),
               "transformer-dropout-ffn": config.get("activation_dropout", 0.0),
               "max-length": config.get("max_position_embeddings")}  # fmt: skip
    shared = config.get("share_encoder_decoder_embeddings", True)  # else vocab.json is the source's alone
    options["tied-embeddings-all"], options["tied-embeddings"] = shared, True
    pad = config["pad_token_id"]
    if config.get("decoder_start_token_id", pad) != pad:
        raise ValueError(f"{config_path}: decoder_start_token_id {config['decoder_start_token_id']} is not pad_token_id "
                         f"{pad}, the zero vector that Marian's decoder starts from.")  # fmt: skip
    vocabularies = [_hugging_face_vocabulary(os.path.join(folder, name), pad)
                    for name in (["vocab.json"] if shared else ["vocab.json", "target_vocab.json"])]  # fmt: skip
    take = _Weights(tensors, path).take
    weights = {"decoder_ff_logit_out_b": take("final_logits_bias")[..., :pad]}
    if shared:
        weights["Wemb"] = take("model.shared.weight")[:pad]
    else:
        weights["encoder_Wemb"] = take("model.encoder.embed_tokens.weight")[:pad]
        weights["decoder_Wemb"] = take("model.decoder.embed_tokens.weight")[:pad]
    for stack, count in (("encoder", config["encoder_layers"]), ("decoder", config["decoder_layers"])):
        for i in range(count):
            marian, theirs = f"{stack}_l{i + 1}", f"model.{stack}.layers.{i}"
            attentions = [("self", "self_attn")] + ([("context", "encoder_attn")] if stack == "decoder" else [])
            for scope, name in attentions:
                for letter, projection in zip("qkvo", ("q_proj", "k_proj", "v_proj", "out_proj")):
                    weights[f"{marian}_{scope}_W{letter}"] = take(f"{theirs}.{name}.{projection}.weight").T
                    weights[f"{marian}_{scope}_b{letter}"] = take(f"{theirs}.{name}.{projection}.bias")
                weights[f"{marian}_{scope}_Wo_ln_scale"] = take(f"{theirs}.{name}_layer_norm.weight")
                weights[f"{marian}_{scope}_Wo_ln_bias"] = take(f"{theirs}.{name}_layer_norm.bias")
            for number in (1, 2):
                weights[f"{marian}_ffn_W{number}"] = take(f"{theirs}.fc{number}.weight").T
                weights[f"{marian}_ffn_b{number}"] = take(f"{theirs}.fc{number}.bias")
            weights[f"{marian}_ffn_ffn_ln_scale"] = take(f"{theirs}.final_layer_norm.weight")
            weights[f"{marian}_ffn_ffn_ln_bias"] = take(f"{theirs}.final_layer_norm.bias")
    return weights, options, vocabularies[0], vocabularies[-1], path


def _torch_tensors(path, folder):
    """The tensors of PyTorch's file `path` (pytorch_model.bin) as float32 NumPy arrays by name,
    read by torch (tensors alone, `weights_only`), which must be installed."""
    try:
        import torch
    except ImportError:
        raise ValueError(f"{folder} has pytorch_model.bin but no model.safetensors: reading it needs torch, which is not "
                         "installed (pip install torch), or save the model with safe_serialization=True first.") from None  # fmt: skip
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # not a file torch saved, or of objects other than tensors
        raise ValueError(f"{path}: torch cannot read it as tensors ({error}).") from None
    return {name: value.float().numpy() for name, value in state.items() if isinstance(value, torch.Tensor)}


def _hugging_face_vocabulary(path, pad):
    """The pieces of Hugging Face's vocabulary file `path` ({piece: id}) by Marian's id: its
    padding, which must be id `pad` and its last (the decoder's zero start), left out."""
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist.")
    with open(path, encoding="utf-8") as f:
        ids = json.load(f)
    if pad != len(ids) - 1:
        raise ValueError(f"{path}: pad_token_id {pad} is not the last of its {len(ids)} ids, which starts the decoder "
                         "from a zero vector as Marian does.")  # fmt: skip
    return pieces_by_id({i: piece for piece, i in ids.items()}, path, pad)


def pieces_by_id(found, path, size=None):
    """The pieces of `found` {id: piece} by id, the first `size` of them (default: all), checked:
    ids 0 to n - 1 each once, Marian's </s> and <unk> first."""
    if sorted(found) != list(range(len(found))):
        raise ValueError(f"{path}: the ids are not 0 to {len(found) - 1} each once.")
    pieces = [found[i] for i in range(len(found))][:size]
    if pieces[:2] != ["</s>", "<unk>"]:
        raise ValueError(f"{path}: ids 0 and 1 are {pieces[:2]}, not Marian's </s> and <unk>.")
    return pieces


def load_marian(folder):
    """A `Transformer` of the OPUS-MT model in `folder`, in either form; returns (the model, the
    source's pieces in our ids, the target's: one list twice for a model of one vocabulary)."""
    from keras_transformer.model import Transformer

    weights, options, source, target, path = read_model(folder)
    config = config_from_options(options, len(source), len(target), path)
    model = Transformer(config)
    marian = _Weights(weights, path)
    d = config.d_model
    if config.source_vocab_size is None:
        model.embedding.embeddings.assign(_in_our_ids(marian.take("Wemb", (len(target), d))))
    else:
        model.source_embedding.embeddings.assign(_in_our_ids(marian.take("encoder_Wemb", (len(source), d))))
        model.embedding.embeddings.assign(_in_our_ids(marian.take("decoder_Wemb", (len(target), d))))
    bias = _in_our_ids(marian.take("decoder_ff_logit_out_b", (len(target),)))
    bias[BOS_ID] = NEG_INF
    model.embedding.bias.assign(bias)
    for number, layer in enumerate(model.encoder.layers, 1):
        _attention(marian, f"encoder_l{number}_self", layer.self_attention, layer.self_attention_norm)
        _feed_forward(marian, f"encoder_l{number}_ffn", layer.feed_forward, layer.feed_forward_norm)
    for number, layer in enumerate(model.decoder.layers, 1):
        _attention(marian, f"decoder_l{number}_self", layer.self_attention, layer.self_attention_norm)
        _attention(marian, f"decoder_l{number}_context", layer.cross_attention, layer.cross_attention_norm)
        _feed_forward(marian, f"decoder_l{number}_ffn", layer.feed_forward, layer.feed_forward_norm)
    return model, vocabulary_in_our_ids(source), vocabulary_in_our_ids(target)


def _in_our_ids(rows):
    """Marian's `rows` (a row an id) in our ids: padding's and the begin of sentence's are zero."""
    ours = np.zeros((len(rows) + NEW_ROWS, *rows.shape[1:]), np.float32)
    ours[our_id(np.arange(len(rows)))] = rows
    return ours


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
