"""Marian's models (OPUS-MT) read into a `Transformer` (training/marian.py) from either form,
checked against two independent readers of the same files: Marian's Transformer written out in
NumPy, in Marian's own ids, and CTranslate2's own OPUS-MT converter; and both forms of the same
weights against each other. No trained model can be downloaded here, so each test writes a
Marian model of random weights, with LayerNorms and biases far from their initial 1 and 0, so
that a swapped tensor shows."""

import dataclasses
import io
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from bench import marian_release
from conftest import SAVED_MODEL_CLI, assert_stock_cpu_graph, warmup_requests
from export import ctranslate2 as conversion
from keras_transformer.common import BOS_ID, EOS_ID, NEG_INF, PAD_ID, UNK_ID
from keras_transformer.search import decode
from training import marian

# Plain pieces that a YAML reader would take for a boolean, a number or null; and quoted ones.
PIECES = ["</s>", "<unk>", "▁the", "▁a", "yes", "1", "null", "▁dog", "s", "▁red", "'", ":", "▁car", "▁sees", "ed",
          "▁é"]
PLAIN = {"yes", "1", "null", "s", "ed"}
SOURCE_PIECES = ["</s>", "<unk>", "▁le", "▁chien", "▁rouge", "▁voit", "▁la", "▁voiture", "s", "yes", "▁petit"]
D_MODEL, HEADS, D_FF = 16, 2, 32
MAX_LENGTH = 9
END_BIAS = 1.5  # on </s>'s logit, so that some outputs end before the length limit


def write_marian_model(folder, activation="swish", encoder_layers=2, decoder_layers=1, seed=0, separate=False,
                       pieces=PIECES, source_pieces=SOURCE_PIECES, **options):  # fmt: skip
    """An OPUS-MT release folder of random weights at this module's sizes (bench/marian_release.py):
    model.npz, vocab.yml of `pieces` (or with `separate`, source.vocab.yml of `source_pieces` and
    target.vocab.yml of `pieces`, as models of two vocabularies have) and decoder.yml. `options`
    replace Marian's options in the model. Returns the folder's (model, target vocabulary) paths."""
    return marian_release.write_release(
        folder, pieces, d_model=D_MODEL, heads=HEADS, d_ff=D_FF, encoder_layers=encoder_layers, decoder_layers=decoder_layers,
        activation=activation, seed=seed, source_pieces=source_pieces if separate else None, plain=PLAIN, end_bias=END_BIAS,
        **options)  # fmt: skip


def write_hugging_face_model(folder, marian_folder, source_pieces=None):
    """The Marian model in `marian_folder` (of PIECES, or with `source_pieces` of two vocabularies)
    in Hugging Face's form (bench/marian_release.py)."""
    return marian_release.write_hugging_face(folder, marian_folder, PIECES, source_pieces)


def sources(pieces=PIECES, n=6, seed=1):
    """Random sources of `pieces` (no special ones), each a list of 2 to 6 pieces."""
    rng = np.random.default_rng(seed)
    return [[pieces[i] for i in rng.integers(2, len(pieces), rng.integers(2, 7))] for _ in range(n)]


def our_greedy(model, vocabulary, source_pieces):
    """Our greedy translations (our ids, without the end of sentence) and their log-probabilities
    (alpha 0), of 1 to MAX_LENGTH tokens; and the sources in our ids."""
    index = {piece: i for i, piece in enumerate(vocabulary)}
    width = max(len(s) for s in source_pieces) + 1
    ids = np.full((len(source_pieces), width), PAD_ID, np.int32)
    for row, pieces in enumerate(source_pieces):
        ids[row, : len(pieces) + 1] = [index[p] for p in pieces] + [EOS_ID]
    result = decode(model, ids, beam_size=1, alpha=0.0, max_length=MAX_LENGTH, min_length=1)
    return [[int(t) for t in row if t != PAD_ID] for row in np.asarray(result.tokens)], np.asarray(result.scores), ids


def reference_log_probs(weights, activation, encoder_layers, decoder_layers, source, target):
    """Marian's Transformer written out in float64 NumPy from its own arrays and ids: the
    log-probability of each next token `[len(target), vocab]` after the decoder read its zero
    start vector and `target[:-1]`; `source` and `target` in Marian's ids, each ending with </s>.
    Embeddings scaled by sqrt(d_model) plus a sine half and a cosine half of the sinusoids;
    post-norm layers (LayerNorm epsilon 1e-6) with q, k, v, o projections split into heads in
    order; the logits through the embedding and Marian's bias."""
    w = {name: np.asarray(value, np.float64) for name, value in weights.items() if name != "special:model.yml"}
    head = D_MODEL // HEADS

    def positions(n):
        angle = np.arange(n)[:, None] / 10000 ** (2 * np.arange(D_MODEL // 2)[None] / D_MODEL)
        return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)

    def norm(x, scope):
        mean, variance = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mean) / np.sqrt(variance + 1e-6) * w[f"{scope}_ln_scale"] + w[f"{scope}_ln_bias"]

    def attention(x, memory, scope, causal=False):
        def heads(y, name):
            return (y @ w[f"{scope}_W{name}"] + w[f"{scope}_b{name}"]).reshape(len(y), HEADS, head).transpose(1, 0, 2)

        scores = heads(x, "q") @ heads(memory, "k").transpose(0, 2, 1) / np.sqrt(head)
        if causal:
            scores = scores + np.triu(np.full((len(x), len(memory)), -1e9), 1)
        weights_ = np.exp(scores - scores.max(-1, keepdims=True))
        weights_ /= weights_.sum(-1, keepdims=True)
        mixed = (weights_ @ heads(memory, "v")).transpose(1, 0, 2).reshape(len(x), D_MODEL)
        return norm(x + mixed @ w[f"{scope}_Wo"] + w[f"{scope}_bo"], f"{scope}_Wo")

    def feed_forward(x, scope):
        inner = x @ w[f"{scope}_W1"] + w[f"{scope}_b1"]
        inner = inner / (1 + np.exp(-inner)) if activation == "swish" else np.maximum(inner, 0)
        return norm(x + inner @ w[f"{scope}_W2"] + w[f"{scope}_b2"], f"{scope}_ffn")

    embedding = w.get("decoder_Wemb", w.get("Wemb"))  # the target's, and the output projection
    x = w.get("encoder_Wemb", embedding)[source] * np.sqrt(D_MODEL) + positions(len(source))
    for number in range(1, encoder_layers + 1):
        x = feed_forward(attention(x, x, f"encoder_l{number}_self"), f"encoder_l{number}_ffn")
    y = np.concatenate([np.zeros((1, D_MODEL)), embedding[target[:-1]] * np.sqrt(D_MODEL)]) + positions(len(target))
    for number in range(1, decoder_layers + 1):
        y = attention(y, y, f"decoder_l{number}_self", causal=True)
        y = feed_forward(attention(y, x, f"decoder_l{number}_context"), f"decoder_l{number}_ffn")
    logits = y @ embedding.T + w["decoder_ff_logit_out_b"]
    logits = logits - logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def test_the_vocabulary_takes_our_layout_and_plain_pieces_stay_strings(tmp_path):
    _, vocabulary_path = write_marian_model(tmp_path)
    assert marian.read_vocabulary(vocabulary_path) == PIECES
    ours = marian.vocabulary_in_our_ids(PIECES)
    assert len(ours) == len(PIECES) + 2
    assert (ours[PAD_ID], ours[1], ours[BOS_ID], ours[EOS_ID]) == ("<pad>", "<unk>", "<s>", "</s>")
    assert ours[4:] == PIECES[2:]
    assert [ours[i] for i in marian.our_id(np.arange(len(PIECES)))] == PIECES
    assert [PIECES[i] for i in marian.marian_id([UNK_ID, EOS_ID, *range(4, len(ours))])] == ours[1:2] + ours[3:]


# (seed 2 of the model of two vocabularies: one whose outputs end at several lengths)
@pytest.mark.parametrize("activation, encoder_layers, decoder_layers, separate, seed",
                         [("swish", 2, 1, False, 0), ("relu", 1, 2, False, 0), ("swish", 1, 1, True, 2)])  # fmt: skip
def test_an_imported_model_translates_and_scores_as_marians_transformer_written_out(
    tmp_path, activation, encoder_layers, decoder_layers, separate, seed
):
    model_path, _ = write_marian_model(tmp_path, activation, encoder_layers, decoder_layers, seed, separate)
    model, source_vocabulary, vocabulary = marian.load_marian(tmp_path)
    source_pieces = SOURCE_PIECES if separate else PIECES
    assert model.config.source_vocab_size == (len(SOURCE_PIECES) + 2 if separate else None)
    assert (model.config.encoder_layers, model.config.decoder_layers, model.config.activation) == (
        encoder_layers, decoder_layers, activation)  # fmt: skip
    assert float(model.embedding.bias[BOS_ID]) == NEG_INF and not np.any(model.embedding.embeddings[BOS_ID])
    with np.load(model_path) as npz:
        weights = {name: npz[name] for name in npz.files}
    to_marian = {int(marian.our_id(i)): i for i in range(max(len(PIECES), len(source_pieces)))}
    tokens, scores, sources_ = our_greedy(model, source_vocabulary, sources(source_pieces))
    assert len({len(t) for t in tokens}) > 1, tokens  # some end before the limit: the end of sentence is scored too
    for output, score, source in zip(tokens, scores, sources_):
        source = [to_marian[int(t)] for t in source if t != PAD_ID]
        ended = len(output) < MAX_LENGTH  # else the length limit cut it
        target = [to_marian[t] for t in output] + ([marian.MARIAN_EOS] if ended else [])
        log_probs = reference_log_probs(weights, activation, encoder_layers, decoder_layers, source,
                                        target if ended else target + [marian.MARIAN_EOS])  # fmt: skip
        log_probs_ = log_probs.copy()
        log_probs_[0, marian.MARIAN_EOS] = -np.inf  # min_length=1
        assert target == list(np.argmax(log_probs_, axis=-1)[: len(target)])  # greedy: the most likely each step
        np.testing.assert_allclose(score, sum(log_probs[i, t] for i, t in enumerate(target)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation, separate", [("swish", False), ("relu", False), ("swish", True)])
def test_an_imported_model_translates_and_scores_as_ctranslate2s_own_conversion(tmp_path, activation, separate):
    if not conversion.available():
        pytest.skip(f"ctranslate2 is not installed: {conversion.INSTALL}")
    import ctranslate2
    from ctranslate2.converters import OpusMTConverter

    write_marian_model(tmp_path / "opus", activation, 2, 1, separate=separate)
    model, source_vocabulary, vocabulary = marian.load_marian(tmp_path / "opus")
    source_pieces = sources(SOURCE_PIECES if separate else PIECES)
    tokens, scores, _ = our_greedy(model, source_vocabulary, source_pieces)
    OpusMTConverter(str(tmp_path / "opus")).convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    greedy = dict(beam_size=1, min_decoding_length=1, max_decoding_length=MAX_LENGTH)
    results = translator.translate_batch(source_pieces, **greedy)
    outputs = [[vocabulary[t] for t in output] for output in tokens]
    assert outputs == [r.hypotheses[0] for r in results]
    # Its log-probabilities of our outputs, </s> appended (those that the length limit cut, without its).
    scored = translator.score_batch(source_pieces, outputs)
    expected = [sum(s.log_probs[: len(o) + (len(o) < MAX_LENGTH)]) for s, o in zip(scored, outputs)]
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    # The CTranslate2 export of the imported model (export/ctranslate2.py) translates as CTranslate2's conversion.
    conversion.convert(model, str(tmp_path / "ours"), vocabulary, source_vocabulary=source_vocabulary)
    ours = ctranslate2.Translator(str(tmp_path / "ours"), device="cpu").translate_batch(source_pieces, **greedy)
    assert [r.hypotheses[0] for r in ours] == outputs


# Hugging Face's conversion of a model of two vocabularies asks for them of one size.
SOURCE_PIECES_OF_TARGETS_SIZE = [*SOURCE_PIECES, "▁grand", "▁bleu", "▁vert", "▁noir", "▁blanc"]


@pytest.mark.parametrize("activation, separate", [("swish", False), ("relu", False), ("swish", True)])
def test_both_forms_of_the_same_weights_import_to_the_same_model(tmp_path, activation, separate):
    source_pieces = SOURCE_PIECES_OF_TARGETS_SIZE if separate else None
    write_marian_model(tmp_path / "marian", activation, 1, 2, separate=separate, source_pieces=source_pieces)
    write_hugging_face_model(tmp_path / "hugging-face", tmp_path / "marian", source_pieces)
    (one, *one_vocabulary), (other, *other_vocabulary) = (
        marian.load_marian(tmp_path / form) for form in ("marian", "hugging-face"))  # fmt: skip
    assert one.config == other.config and one_vocabulary == other_vocabulary
    assert (one.config.source_vocab_size is not None) == separate and (one_vocabulary[0] != one_vocabulary[1]) == separate
    for variable, same in zip(one.weights, other.weights, strict=True):
        np.testing.assert_array_equal(variable.numpy(), same.numpy(), err_msg=variable.path)


def test_hugging_faces_pytorch_model_bin_imports_as_its_safetensors_where_torch_is_installed(tmp_path):
    """Optional: where torch is installed (not among the requirements), a pytorch_model.bin of the
    same tensors imports to the same model; tests/test_marian.py's next test checks the refusal
    without it."""
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file

    write_marian_model(tmp_path / "marian")
    safetensors = write_hugging_face_model(tmp_path / "hf", tmp_path / "marian")
    pickled = write_hugging_face_model(tmp_path / "pytorch", tmp_path / "marian")
    tensors = load_file(str(pickled / "model.safetensors"))
    (pickled / "model.safetensors").unlink()
    torch.save({name: torch.from_numpy(value) for name, value in tensors.items()}, str(pickled / "pytorch_model.bin"))
    (one, *one_vocabulary), (other, *other_vocabulary) = (marian.load_marian(f) for f in (safetensors, pickled))
    assert one.config == other.config and one_vocabulary == other_vocabulary
    for variable, same in zip(one.weights, other.weights, strict=True):
        np.testing.assert_array_equal(variable.numpy(), same.numpy(), err_msg=variable.path)
    torch.save({"not a tensor": object()}, str(pickled / "pytorch_model.bin"))
    with pytest.raises(ValueError, match=f"{pickled / 'pytorch_model.bin'}: torch cannot read it as tensors"):
        marian.load_marian(pickled)


def test_hugging_faces_form_without_safetensors_or_of_another_model_is_refused(tmp_path, monkeypatch):
    write_marian_model(tmp_path / "marian")
    folder = write_hugging_face_model(tmp_path / "hf", tmp_path / "marian")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with monkeypatch.context() as without_torch:
        without_torch.setitem(sys.modules, "torch", None)  # `import torch` fails, as where it is not installed
        with pytest.raises(ValueError, match=f"{folder} has pytorch_model.bin but no model.safetensors: reading it needs torch"):
            marian.load_marian(folder)
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(ValueError, match=f"{folder} has neither model.safetensors nor pytorch_model.bin"):
        marian.load_marian(folder)
    write_hugging_face_model(tmp_path / "hf", tmp_path / "marian")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "bart"}))
    with pytest.raises(ValueError, match=f"{folder / 'config.json'}: model_type 'bart': only marian can be imported"):
        marian.load_marian(folder)
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))  # an output matrix of its own
    with pytest.raises(ValueError, match=f"{folder / 'config.json'}: tie_word_embeddings False; only True can be imported"):
        marian.load_marian(folder)
    (folder / "config.json").write_text(json.dumps({**config, "share_encoder_decoder_embeddings": False}))
    with pytest.raises(ValueError, match=f"{folder / 'target_vocab.json'} does not exist"):
        marian.load_marian(folder)


@pytest.mark.parametrize(
    "change, message",
    [({"transformer-postprocess": "da", "transformer-preprocess": "n"}, "--transformer-preprocess is 'n'"),
     ({"tied-embeddings-all": False, "tied-embeddings": False}, "--tied-embeddings is False"),
     ({"transformer-ffn-activation": "gelu"}, "--transformer-ffn-activation 'gelu'"),
     ({"type": "s2s"}, "--type is 's2s'")],
)  # fmt: skip
def test_a_model_that_is_not_marians_post_norm_transformer_is_refused_naming_the_file_and_option(
    tmp_path, change, message
):
    model_path, _ = write_marian_model(tmp_path, **change)
    with pytest.raises(ValueError, match=f"{model_path}: Marian's {message}"):
        marian.load_marian(tmp_path)


def test_a_missing_or_misshapen_tensor_is_refused_naming_the_file_and_tensor(tmp_path):
    model_path, _ = write_marian_model(tmp_path)
    with np.load(model_path) as npz:
        weights = {name: npz[name] for name in npz.files}
    np.savez(model_path, **{k: v for k, v in weights.items() if k != "decoder_l1_context_Wk"})
    with pytest.raises(ValueError, match=f"{model_path} has no tensor decoder_l1_context_Wk"):
        marian.load_marian(tmp_path)
    np.savez(model_path, **{**weights, "encoder_l2_ffn_W1": weights["encoder_l2_ffn_W1"][:, :-1]})
    with pytest.raises(ValueError, match=rf"{model_path}: encoder_l2_ffn_W1 has shape \(16, 31\)"):
        marian.load_marian(tmp_path)


def write_release(folder, separate=False, seed=0, tags=()):
    """An OPUS-MT release folder as `write_marian_model`'s, with the SentencePiece models of
    OPUS-MT's layout (SentencePiece's own ids: <unk> 0, <s> 1, </s> 2) learned on synthetic
    pairs, source.spm and target.spm, and a vocabulary of their pieces as marian-vocab makes it
    (one of both sides' pieces, or one each with `separate`), with pieces that neither model has
    (PLAIN), and with `tags` (languages) the pieces of a multi-target model, `>>fra<<`. Returns
    (the pairs, the SentencePiece processors of the source and the target)."""
    import sentencepiece

    from training.synthetic import generate_splits

    pairs = generate_splits(seed, 200, 8, 8)["train"]
    folder.mkdir(parents=True, exist_ok=True)
    processors = []
    for side, name in enumerate(("source.spm", "target.spm")):
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter([pair[side] for pair in pairs]), model_writer=model,
                                                 vocab_size=60, hard_vocab_limit=False, minloglevel=2)  # fmt: skip
        (folder / name).write_bytes(model.getvalue())
        processors.append(sentencepiece.SentencePieceProcessor(model_proto=model.getvalue()))

    def vocabulary(*chosen):
        found = dict.fromkeys(p.id_to_piece(i) for p in chosen for i in range(p.get_piece_size()) if not
                              (p.is_control(i) or p.is_unknown(i)))  # fmt: skip
        return ["</s>", "<unk>", *found, *sorted(PLAIN), *(f">>{tag}<<" for tag in tags)]

    if separate:
        write_marian_model(folder, separate=True, seed=seed, pieces=vocabulary(processors[1]),
                           source_pieces=vocabulary(processors[0]))  # fmt: skip
    else:
        write_marian_model(folder, seed=seed, pieces=vocabulary(*processors))
    return pairs, processors


def marians_ids(processor, vocabulary, text):
    """Marian's reading of `text`: its SentencePiece pieces, each its id in `vocabulary` (a list
    of pieces), or <unk>'s; then </s>."""
    index = {piece: i for i, piece in reversed(list(enumerate(vocabulary)))}
    return [index.get(piece, marian.MARIAN_UNK) for piece in processor.encode(text, out_type=str)] + [marian.MARIAN_EOS]


@pytest.mark.parametrize("separate", [False, True])
def test_an_imported_run_folder_holds_the_weights_and_reads_text_as_marian_does(tmp_path, separate):
    from training import import_marian
    from training.run_folder import RunFolder

    pairs, (source_spm, target_spm) = write_release(tmp_path / "opus-mt-en-de", separate)
    import_marian.main([str(tmp_path / "opus-mt-en-de"), "--run-dir", str(tmp_path / "run")])  # languages from the name
    run = RunFolder(str(tmp_path / "run"))
    assert (run.settings()["pairs"], run.settings()["imported_from"]) == ("en-de", str(tmp_path / "opus-mt-en-de"))
    model, checkpoint = run.load_model()
    expected, source_pieces, target_pieces = marian.load_marian(tmp_path / "opus-mt-en-de")
    assert checkpoint == run.checkpoint("latest")  # step 0, which --init-from starts from
    for ours, theirs in zip(model.weights, expected.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.path)
    # Text to ids and back as Marian reads and writes it, a piece that the vocabulary lacks (and
    # a vocabulary piece that SentencePiece lacks) included.
    tokenizer = run.load_tokenizer()
    sources = [source for source, _ in pairs[:6]] + ["the Zebra 7 walks"]
    _, _, marians_source, _, _ = marian.read_model(tmp_path / "opus-mt-en-de")  # in Marian's ids
    expected_ids = [marian.our_id(marians_ids(source_spm, marians_source, source)).tolist() for source in sources]
    assert tokenizer.encode_source(tf.constant(sources)).to_list() == expected_ids
    assert UNK_ID in expected_ids[-1]
    targets = [target for _, target in pairs[:6]]
    target_ids = tokenizer.target.tokenize(tf.constant(targets)).to_tensor()  # padded with 0
    assert [t.decode() for t in tokenizer.target.detokenize(target_ids).numpy()] == targets
    pieces = [[target_pieces[i] for i in row if i] for row in target_ids.numpy()]
    assert pieces == [target_spm.encode(t, out_type=str) for t in targets]
    # A piece of the vocabulary that SentencePiece lacks is written as SentencePiece's unknown.
    assert tokenizer.target.detokenize(tf.constant([[target_pieces.index("yes"), EOS_ID]])).numpy().tolist() == [
        target_spm.decode_ids([target_spm.piece_to_id("yes")]).encode()]  # fmt: skip
    # The folder is not a training run to resume; the same --run-dir is refused.
    with pytest.raises(ValueError, match=f"fine-tune it into a new --run-dir with --init-from {run.path}"):
        run.check_resume(run.config(), run.settings())
    with pytest.raises(SystemExit, match="holds a run already"):
        import_marian.main([str(tmp_path / "opus-mt-en-de"), "--run-dir", run.path])


@pytest.mark.slow
def test_an_imported_model_exported_translates_and_scores_text_as_ctranslate2s_conversion_and_evaluates(tmp_path):
    """The SavedModel of an imported run (`python -m export`) and CTranslate2's own conversion of
    the same release folder, each with its tokenizers, take the same text to the same greedy
    translations and scores; training.evaluate scores the run on the corpus the import named."""
    if not conversion.available():
        pytest.skip(f"ctranslate2 is not installed: {conversion.INSTALL}")
    import ctranslate2
    from ctranslate2.converters import OpusMTConverter

    from export.saved_model import export
    from keras_transformer.search import DecodingSettings
    from training import evaluate, import_marian

    pairs, (source_spm, target_spm) = write_release(tmp_path / "opus", separate=True)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, chosen in (("train", pairs[:4]), ("dev", pairs[4:8]), ("test", pairs[8:12])):
        for side, language in enumerate(("en", "de")):
            (corpus / f"{split}.{language}").write_text("".join(pair[side] + "\n" for pair in chosen))
    run_dir = str(tmp_path / "run")
    import_marian.main([str(tmp_path / "opus"), "--run-dir", run_dir, "--dataset", str(corpus), "--source-lang", "en",
                        "--target-lang", "de"])  # fmt: skip
    greedy = DecodingSettings(beam_size=1, alpha=0.0, max_length_a=0.0, max_length_b=MAX_LENGTH, min_length=1)
    export_dir = export(run_dir, str(tmp_path / "exports"), greedy)
    served = tf.saved_model.load(export_dir)
    sources = [source for source, _ in pairs[:8]] + ["the Zebra 7 walks"]
    aligned = served.signatures["alignments"](text=tf.constant(sources))
    translations = [t.decode() for t in served.signatures["serving_default"](text=tf.constant(sources))["translation"].numpy()]
    assert translations == [t.decode() for t in aligned["translation"].numpy()]

    OpusMTConverter(str(tmp_path / "opus")).convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    source_pieces = [source_spm.encode(source, out_type=str) for source in sources]
    known = set(marian.read_model(tmp_path / "opus")[2])  # the source's vocabulary: a piece it lacks is <unk>
    assert [[p.decode() for p in row if p] for row in aligned["source_pieces"].numpy()] == [
        [*(p if p in known else "<unk>" for p in pieces), "</s>"] for pieces in source_pieces]  # fmt: skip
    results = translator.translate_batch(source_pieces, beam_size=1, min_decoding_length=1, max_decoding_length=MAX_LENGTH)
    outputs = [result.hypotheses[0] for result in results]
    assert [[p.decode() for p in row if p not in (b"", b"</s>")] for row in aligned["target_pieces"].numpy()] == outputs
    # Written by the target's SentencePiece model from its ids (a piece that it lacks: its unknown).
    assert translations == [target_spm.decode_ids([target_spm.piece_to_id(p) for p in output]) for output in outputs]
    targets = [target for _, target in pairs[:8]]
    scores = served.signatures["score"](text=tf.constant(sources[:8]), target=tf.constant(targets), alpha=tf.zeros([8]))["log_prob"].numpy()
    scored = translator.score_batch(source_pieces[:8], [target_spm.encode(target, out_type=str) for target in targets])
    np.testing.assert_allclose(scores, [sum(s.log_probs) for s in scored], rtol=1e-4, atol=1e-4)

    # The warm-up file replays (as TF Serving does before it serves), the graph has stock ops
    # only, and saved_model_cli's loader (the C++ loader's graph and init ops) translates alike.
    for name, inputs in warmup_requests(export_dir):
        served.signatures[name](**inputs)
    assert_stock_cpu_graph(export_dir)
    ran = subprocess.run([*SAVED_MODEL_CLI, "run", "--dir", export_dir, "--tag_set", "serve", "--signature_def",
                          "serving_default", "--input_exprs", f"text={json.dumps(sources[-1:])}"],
                         check=True, capture_output=True, text=True, timeout=300).stdout  # fmt: skip
    assert f"Result for output key translation:\n[{translations[-1].encode()!r}]" in ran

    evaluate.main(["--run-dir", run_dir, "--no-xla", "--beam-size", "1", "--alpha", "0", "--max-length-a", "0",
                   "--max-length-b", str(MAX_LENGTH), "--min-length", "1"])  # fmt: skip
    test_sources = [source for source, _ in pairs[8:12]]
    expected = served.signatures["serving_default"](text=tf.constant(test_sources))["translation"].numpy()
    assert (tmp_path / "run" / "translations.test.txt").read_text().splitlines() == [t.decode() for t in expected]
    assert "bleu" in json.loads((tmp_path / "run" / "metrics.json").read_text())

    # Fine-tuned (--init-from, no model flag): the imported model and tokenizer at step 0, trained on.
    from training.run_folder import RunFolder
    from training.train import parse_args, train

    tuned = RunFolder(str(tmp_path / "tuned"))
    train(parse_args(["--run-dir", tuned.path, "--init-from", run_dir, "--dataset", str(corpus), "--source-lang", "en",
                      "--target-lang", "de", "--steps", "2", "--checkpoint-every", "2", "--steps-per-call", "1",
                      "--batch-tokens", "256", "--max-length", "32", "--dropout", "0", "--no-evaluate", "--no-xla",
                      "--strategy", "cpu"]))  # fmt: skip
    imported, _ = RunFolder(run_dir).load_model()
    assert tuned.config() == dataclasses.replace(imported.config, max_length=32, dropout=0.0)
    assert tuned.load_tokenizer().digest() == RunFolder(run_dir).load_tokenizer().digest()
    for step, same in (("0", True), ("2", False)):
        weights = tuned.load_model(step)[0].weights
        assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(weights, imported.weights)) == same


@pytest.mark.slow
def test_a_multi_target_model_serves_each_language_by_its_tag_as_ctranslate2s_conversion_does(tmp_path):
    """An OPUS-MT model of several targets (its vocabulary's >>fra<< pieces) imports as a run of a
    pair for each; a source's leading <2spa> (this project's tag) or >>spa<< (OPUS-MT's) is the
    piece >>spa<<, and the served target_language puts it there, as CTranslate2's conversion
    of the folder reads it."""
    from export.serving import Translator
    from keras_transformer.search import DecodingSettings
    from training import import_marian, languages
    from training.run_folder import RunFolder

    pairs, (source_spm, _) = write_release(tmp_path / "opus-mt-en-mul", tags=("fra", "spa"))
    import_marian.main([str(tmp_path / "opus-mt-en-mul"), "--run-dir", str(tmp_path / "run")])  # the model's targets
    run = RunFolder(str(tmp_path / "run"))
    assert run.pairs() == (("en", "fra"), ("en", "spa"))
    tokenizer = run.load_tokenizer()
    assert languages.languages(tokenizer) == ("fra", "spa") and run.targets() == {"fra": "<2fra> ", "spa": "<2spa> "}
    text = pairs[0][0]
    plain = tokenizer.encode_source(tf.constant([text])).to_list()[0]
    spa = tokenizer.source.piece_list().index(">>spa<<")
    for asked in (f"<2spa> {text}", f">>spa<< {text}"):
        assert tokenizer.encode_source(tf.constant([asked, text])).to_list() == [[spa, *plain], plain]
    assert tokenizer.encode_source(tf.constant(f"<2spa> {text}")).numpy().tolist() == [spa, *plain]
    with pytest.raises(SystemExit, match=r"lacks <2deu>"):
        import_marian.main([str(tmp_path / "opus-mt-en-mul"), "--run-dir", str(tmp_path / "other"), "--target-lang", "deu"])

    greedy = DecodingSettings(beam_size=1, alpha=0.0, max_length_a=0.0, max_length_b=MAX_LENGTH, min_length=1)
    translator = Translator(run.load_model()[0], tokenizer, greedy, languages=run.targets())
    sources = [source for source, _ in pairs[:4]]
    asked = tf.constant(["fra", "spa", "spa", "fra"])
    aligned = translator.alignments(tf.constant(sources), target_language=asked)
    assert [row[0] for row in aligned["source_pieces"].numpy()] == [b">>fra<<", b">>spa<<", b">>spa<<", b">>fra<<"]
    if not conversion.available():
        pytest.skip(f"ctranslate2 is not installed: {conversion.INSTALL}")
    import ctranslate2
    from ctranslate2.converters import OpusMTConverter

    OpusMTConverter(str(tmp_path / "opus-mt-en-mul")).convert(str(tmp_path / "ct2"))
    tagged = [[f">>{language}<<", *source_spm.encode(source, out_type=str)] for source, language in
              zip(sources, ["fra", "spa", "spa", "fra"])]  # fmt: skip
    results = ctranslate2.Translator(str(tmp_path / "ct2")).translate_batch(
        tagged, beam_size=1, min_decoding_length=1, max_decoding_length=MAX_LENGTH)  # fmt: skip
    assert [[p.decode() for p in row if p not in (b"", b"</s>")] for row in aligned["target_pieces"].numpy()] == [
        result.hypotheses[0] for result in results]  # fmt: skip
