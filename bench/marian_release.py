"""An OPUS-MT release folder of random weights, as Marian writes one: `model.npz` (its arrays
under Marian's names and shapes, and its options as `special:model.yml`), the vocabularies
(`*.vocab.yml`) and `decoder.yml`. No trained OPUS-MT model can be downloaded here: the tests of
training/marian.py and bench/decode.py's `--marian` rows import such a folder (and CTranslate2's
own OpusMTConverter converts it). And the same model in Hugging Face's form, as its conversion
writes it (`write_hugging_face`), which transformers' MarianMTModel reads.

    write_release(folder, pieces, d_model=512, heads=8, d_ff=2048, encoder_layers=6, decoder_layers=6)
    write_hugging_face(hugging_face_folder, folder, pieces)
"""

import json

import numpy as np
import yaml


def marian_weights(rng, vocab, d_model, d_ff, encoder_layers, decoder_layers, source_vocab=None, scale=0.4, end_bias=0.0):
    """Random arrays under Marian's names and shapes (W `[in, out]`, b and LayerNorms `[1, n]`,
    LayerNorms and biases away from their initial 1 and 0, so that a swapped tensor shows): one
    embedding `Wemb`, or with `source_vocab` the source's and the target's; `end_bias` added to
    </s>'s logit bias. W are N(0, `scale`)."""

    def matrix(*shape):
        return rng.normal(0, scale, shape).astype(np.float32)

    def row(n, around=0.0):
        return (around + rng.normal(0, 0.3, (1, n))).astype(np.float32)

    if source_vocab is None:
        weights = {"Wemb": matrix(vocab, d_model)}
    else:
        weights = {"encoder_Wemb": matrix(source_vocab, d_model), "decoder_Wemb": matrix(vocab, d_model)}
    weights["decoder_ff_logit_out_b"] = row(vocab)
    weights["decoder_ff_logit_out_b"][0, 0] += end_bias

    def layer(scope, attentions):
        for attention in attentions:
            for name in "qkvo":
                weights[f"{scope}_{attention}_W{name}"] = matrix(d_model, d_model)
                weights[f"{scope}_{attention}_b{name}"] = row(d_model)
            weights[f"{scope}_{attention}_Wo_ln_scale"] = row(d_model, 1.0)
            weights[f"{scope}_{attention}_Wo_ln_bias"] = row(d_model)
        weights[f"{scope}_ffn_W1"], weights[f"{scope}_ffn_b1"] = matrix(d_model, d_ff), row(d_ff)
        weights[f"{scope}_ffn_W2"], weights[f"{scope}_ffn_b2"] = matrix(d_ff, d_model), row(d_model)
        weights[f"{scope}_ffn_ffn_ln_scale"], weights[f"{scope}_ffn_ffn_ln_bias"] = row(d_model, 1.0), row(d_model)

    for number in range(1, encoder_layers + 1):
        layer(f"encoder_l{number}", ["self"])
    for number in range(1, decoder_layers + 1):
        layer(f"decoder_l{number}", ["self", "context"])
    return weights


def write_release(folder, pieces, *, d_model, heads, d_ff, encoder_layers, decoder_layers, activation="swish", seed=0,
                  source_pieces=None, plain=(), scale=0.4, end_bias=0.0, **options):  # fmt: skip
    """Writes an OPUS-MT release folder of random weights (`marian_weights`) in `folder` (a
    pathlib.Path): model.npz, vocab.yml of `pieces` (Marian's </s> and <unk> first), or with
    `source_pieces` source.vocab.yml of those and target.vocab.yml of `pieces` (a model of two
    vocabularies, embeddings untied), and decoder.yml. Pieces are quoted as JSON but those of
    `plain`, written bare as marian-vocab writes them. `options` replace Marian's options in the
    model. Returns the (model, target vocabulary) paths."""
    separate = source_pieces is not None
    source_pieces = source_pieces if separate else pieces
    folder.mkdir(parents=True, exist_ok=True)
    model_options = {"type": "transformer", "dim-emb": d_model, "enc-depth": encoder_layers, "dec-depth": decoder_layers,
                     "transformer-heads": heads, "transformer-dim-ffn": d_ff, "transformer-ffn-activation": activation,
                     "transformer-preprocess": "", "transformer-postprocess": "dan", "transformer-postprocess-emb": "d",
                     "transformer-decoder-autoreg": "self-attention", "transformer-no-projection": False,
                     "transformer-guided-alignment-layer": "last", "tied-embeddings-all": not separate,
                     "tied-embeddings": separate, "dim-vocabs": [len(source_pieces), len(pieces)],
                     **options}  # fmt: skip
    weights = marian_weights(np.random.default_rng(seed), len(pieces), d_model, d_ff, encoder_layers, decoder_layers,
                             len(source_pieces) if separate else None, scale, end_bias)  # fmt: skip
    config = yaml.safe_dump(model_options).encode() + b"\0"  # Marian stores it as a C string
    np.savez(folder / "model.npz", **weights, **{"special:model.yml": np.frombuffer(config, np.int8)})
    names = ["source.vocab.yml", "target.vocab.yml"] if separate else ["vocab.yml", "vocab.yml"]
    for name, side in zip(names, (source_pieces, pieces)):
        lines = [piece if piece in plain else json.dumps(piece, ensure_ascii=False) for piece in side]  # UTF-8
        (folder / name).write_text("".join(f"{piece}: {i}\n" for i, piece in enumerate(lines)), encoding="utf-8")
    (folder / "decoder.yml").write_text(yaml.safe_dump({"models": ["model.npz"], "vocabs": names}))
    return folder / "model.npz", folder / names[1]


def write_hugging_face(folder, release, pieces, source_pieces=None):
    """The model of the release folder `release` (of `pieces`, or with `source_pieces` of two
    vocabularies: as many) in Hugging Face's form in `folder`, as its conversion writes it:
    config.json, model.safetensors (torch's Linear weights `[out, in]`; one shared embedding with
    a zero row for <pad>, the last id, which starts the decoder) and vocab.json; for a model of
    two vocabularies, the encoder's and the decoder's embeddings, and vocab.json of the source's
    pieces and target_vocab.json of the target's. Returns `folder`."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    with np.load(release / "model.npz") as npz:
        weights = {name: npz[name] for name in npz.files}
    options = yaml.safe_load(weights.pop("special:model.yml").tobytes().rstrip(b"\0"))
    vocab, d_model = len(pieces), options["dim-emb"]

    def padded(embedding):
        return np.concatenate([embedding, np.zeros((1, d_model), np.float32)])

    tensors = {"final_logits_bias": np.pad(weights["decoder_ff_logit_out_b"], ((0, 0), (0, 1)))}
    if source_pieces is None:
        tensors["model.shared.weight"] = padded(weights["Wemb"])
    else:
        tensors["model.encoder.embed_tokens.weight"] = padded(weights["encoder_Wemb"])
        tensors["model.decoder.embed_tokens.weight"] = tensors["lm_head.weight"] = padded(weights["decoder_Wemb"])
    for stack, count in (("encoder", options["enc-depth"]), ("decoder", options["dec-depth"])):
        for i in range(count):
            marian_scope, theirs = f"{stack}_l{i + 1}", f"model.{stack}.layers.{i}"
            attentions = [("self", "self_attn")] + ([("context", "encoder_attn")] if stack == "decoder" else [])
            for scope, name in attentions:
                for letter, projection in zip("qkvo", ("q_proj", "k_proj", "v_proj", "out_proj")):
                    kernel = weights[f"{marian_scope}_{scope}_W{letter}"]
                    tensors[f"{theirs}.{name}.{projection}.weight"] = np.ascontiguousarray(kernel.T)
                    tensors[f"{theirs}.{name}.{projection}.bias"] = weights[f"{marian_scope}_{scope}_b{letter}"].ravel()
                tensors[f"{theirs}.{name}_layer_norm.weight"] = weights[f"{marian_scope}_{scope}_Wo_ln_scale"].ravel()
                tensors[f"{theirs}.{name}_layer_norm.bias"] = weights[f"{marian_scope}_{scope}_Wo_ln_bias"].ravel()
            for number in (1, 2):
                kernel = weights[f"{marian_scope}_ffn_W{number}"]
                tensors[f"{theirs}.fc{number}.weight"] = np.ascontiguousarray(kernel.T)
                tensors[f"{theirs}.fc{number}.bias"] = weights[f"{marian_scope}_ffn_b{number}"].ravel()
            tensors[f"{theirs}.final_layer_norm.weight"] = weights[f"{marian_scope}_ffn_ffn_ln_scale"].ravel()
            tensors[f"{theirs}.final_layer_norm.bias"] = weights[f"{marian_scope}_ffn_ffn_ln_bias"].ravel()
    save_file(tensors, str(folder / "model.safetensors"))
    heads, d_ff = options["transformer-heads"], options["transformer-dim-ffn"]
    config = {"model_type": "marian", "d_model": d_model, "encoder_layers": options["enc-depth"],
              "decoder_layers": options["dec-depth"], "encoder_attention_heads": heads,
              "decoder_attention_heads": heads, "encoder_ffn_dim": d_ff, "decoder_ffn_dim": d_ff,
              "activation_function": options["transformer-ffn-activation"],
              "vocab_size": vocab + 1, "pad_token_id": vocab, "eos_token_id": 0, "decoder_start_token_id": vocab,
              "max_position_embeddings": 512, "scale_embedding": True, "normalize_before": False,
              "share_encoder_decoder_embeddings": source_pieces is None, "decoder_vocab_size": vocab + 1,
              "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    names = {"vocab.json": pieces} if source_pieces is None else {"vocab.json": source_pieces, "target_vocab.json": pieces}
    for name, side in names.items():
        (folder / name).write_text(json.dumps({**{p: i for i, p in enumerate(side)}, "<pad>": vocab}))
    return folder
