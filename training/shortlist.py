"""The vocabulary shortlist's lexical table, learned from a run's training split:
`python -m training.shortlist --run-dir DIR [--candidates 20] [--always 100] [--sample 200000]`.

For each source piece, its `--candidates` likeliest target pieces under IBM Model 1's lexical
translation probabilities t(target | source) (Brown et al., 1993), and the piece itself (a
shared vocabulary copies names and numbers); and the `--always` most frequent target pieces,
candidates of every request (keras_transformer/search/shortlist.py uses them). IBM Model 1 is
written here in NumPy rather than taken from an aligner's package: its probabilities are what
fast_align and eflomal refine into alignments, and a shortlist needs their ranking, not the
alignments; a few EM iterations over a sample of the split are seconds at Multi30k's size and
minutes at WMT's, with no compiled dependency. Memory is bounded by the sample (`--sample`
pairs drawn from the tokenizer's sample, uniform over the split), never by the corpus.

    DIR/shortlist.txt    the table, in CTranslate2's vocabulary map format: a first line of a
                         tab and the always list, then `source piece<TAB>target pieces`, the
                         pieces space-separated (python -m export.ctranslate2 copies it as vmap.txt)
    DIR/shortlist.json   how it was learned: pairs, iterations, sizes, seconds, the tokenizer's
                         SHA-256 (a table of another vocabulary is refused)
"""

import argparse
import hashlib
import os
import random
import sys
import time

import numpy as np

from keras_transformer.quiet import quiet_tensorflow

quiet_tensorflow()

import tensorflow as tf  # noqa: E402

from keras_transformer.common import EOS_ID  # noqa: E402
from training import languages  # noqa: E402
from training.progress import Progress  # noqa: E402

CANDIDATES = 20  # target pieces kept for each source piece
ALWAYS = 100  # the most frequent target pieces, candidates of every request
SAMPLE = 200_000  # training pairs the table is learned from
ITERATIONS = 5  # EM iterations of IBM Model 1
NULL = 0  # IBM Model 1's empty source word, which explains target pieces no source piece does: id 0 (padding)
CHUNK = 2_000  # pairs whose links are held at once


def ibm1(pairs, vocab_size, iterations=ITERATIONS, progress=None):
    """IBM Model 1's t(target | source) from `pairs` of int arrays (source and target pieces, no
    special ids), each source with the empty word `NULL`: (keys int64 `[n]`, sorted, key =
    source * vocab_size + target, for each pair that co-occurs; probabilities float32 `[n]`)."""
    keys, found = np.zeros(0, np.int64), []
    for chunk in _chunks(pairs):  # the distinct links, merged whenever those found since outgrow them
        found.append(np.unique(_links(chunk, vocab_size)[0]))
        if sum(map(len, found)) > len(keys) + 1_000_000:
            keys, found = np.unique(np.concatenate([keys, *found])), []
    keys = np.unique(np.concatenate([keys, *found]))
    probabilities = np.ones(len(keys), np.float32)  # uniform: the first E-step counts co-occurrences
    for iteration in range(iterations):
        counts = np.zeros(len(keys), np.float64)
        for done, chunk in enumerate(_chunks(pairs)):
            links, groups = _links(chunk, vocab_size)
            index = np.searchsorted(keys, links)
            weights = probabilities[index]
            totals = np.bincount(groups, weights=weights)  # each target piece's sum over its sources
            counts += np.bincount(index, weights=weights / totals[groups], minlength=len(keys))
            if progress:
                progress.update(iteration * len(pairs) + min((done + 1) * CHUNK, len(pairs)))
        source_totals = np.bincount(keys // vocab_size, weights=counts, minlength=vocab_size)
        probabilities = (counts / source_totals[keys // vocab_size]).astype(np.float32)
    return keys, probabilities


def _chunks(pairs):
    for start in range(0, len(pairs), CHUNK):
        yield pairs[start : start + CHUNK]


def _links(pairs, vocab_size):
    """Every (source piece or NULL, target piece) of each pair, as keys int64 `[links]`, and the
    target position each belongs to (int `[links]`, numbered across `pairs`)."""
    keys, groups, position = [], [], 0
    for source, target in pairs:
        source = np.concatenate([[NULL], source]).astype(np.int64)
        keys.append((source[None, :] * vocab_size + target[:, None]).reshape(-1))
        groups.append(np.repeat(np.arange(position, position + len(target)), len(source)))
        position += len(target)
    return np.concatenate(keys), np.concatenate(groups)


def lexical_table(keys, probabilities, vocab_size, candidates=CANDIDATES):
    """{source piece: its `candidates` likeliest target pieces, likeliest first} from `ibm1`."""
    sources, targets = keys // vocab_size, keys % vocab_size
    order = np.lexsort((-probabilities, sources))  # by source, then likeliest first
    sources, targets = sources[order], targets[order]
    starts = np.searchsorted(sources, np.arange(vocab_size + 1))
    return {int(s): targets[starts[s] : min(starts[s + 1], starts[s] + candidates)].tolist()
            for s in range(1, vocab_size) if starts[s + 1] > starts[s]}  # fmt: skip


def check_tokenizer(run):
    """Refuses (ValueError) a run whose sides have SentencePiece models of their own: a table is of
    one model's pieces, which a source piece also names among its candidates."""
    if tf.io.gfile.exists(run.target_tokenizer_path):
        raise ValueError(f"{run.path} has a SentencePiece model for each side ({run.target_tokenizer_path}): a "
                         "shortlist is learned for one model of both sides.")  # fmt: skip


def learn(run_dir, candidates=CANDIDATES, always=ALWAYS, sample=SAMPLE, iterations=ITERATIONS):
    """Learns the run's table and writes DIR/shortlist.txt and DIR/shortlist.json; returns the record."""
    import sentencepiece

    from training.run_folder import RunFolder, local_copy

    start = time.monotonic()
    run = RunFolder(run_dir)
    check_tokenizer(run)
    settings = run.settings()
    text = languages.training_split(run.load_corpora(), run.text_dir, tagged=bool(languages.languages(run.load_tokenizer())),
                                    temperature=settings["pair_temperature"], sample_size=sample, seed=settings["seed"])  # fmt: skip
    pairs = text.sample()
    if len(pairs) > sample:
        pairs = random.Random(settings["seed"]).sample(pairs, sample)
    with local_copy(run.tokenizer_path) as path:
        pieces = sentencepiece.SentencePieceProcessor(model_file=path)
        with open(path, "rb") as f:
            tokenizer_sha256 = hashlib.sha256(f.read()).hexdigest()
    sources, targets = (pieces.encode([pair[side] for pair in pairs]) for side in (0, 1))
    ids = [(np.array(s, np.int64), np.array(t, np.int64)) for s, t in zip(sources, targets) if s and t]
    vocab_size = pieces.get_piece_size()
    progress = Progress(f"Learning the shortlist ({iterations} iterations of IBM Model 1)", iterations * len(ids))
    keys, probabilities = ibm1(ids, vocab_size, iterations, progress)
    progress.finish()
    table = lexical_table(keys, probabilities, vocab_size, candidates)
    frequency = np.bincount(np.concatenate([t for _, t in ids]), minlength=vocab_size)
    frequency[: EOS_ID + 1] = 0
    frequent = [int(t) for t in np.argsort(-frequency, kind="stable")[:always] if frequency[t]]
    lines = ["\t" + " ".join(pieces.id_to_piece(t) for t in frequent)]
    for source in range(EOS_ID + 1, vocab_size):
        row = [source, *(t for t in table.get(source, []) if t != source and t > EOS_ID)][: candidates + 1]
        lines.append(pieces.id_to_piece(source) + "\t" + " ".join(pieces.id_to_piece(t) for t in row))
    record = {"method": f"IBM Model 1, {iterations} EM iterations", "pairs": len(ids), "candidates": candidates,
              "always": len(frequent), "vocab_size": vocab_size, "tokenizer_sha256": tokenizer_sha256,
              "seconds": round(time.monotonic() - start, 1)}  # fmt: skip
    run.write_text(run.shortlist_path, "\n".join(lines) + "\n")
    run.write_json(run.shortlist_record_path, record)
    return record


def read(path, pieces):
    """The table of `path` (shortlist.txt's format) for the SentencePiece model `pieces` (a
    `SentencePieceProcessor`): (int32 `[vocab, width]`, row s the candidates of source piece s
    padded with 0; int32 `[n]`, the always list). A piece that is not in the vocabulary is a
    ValueError naming the file and line."""
    vocab_size = pieces.get_piece_size()
    rows, always = {}, []
    with tf.io.gfile.GFile(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip("\n"):
                continue
            source, tab, targets = line.rstrip("\n").partition("\t")
            ids = []
            for piece in ([source] if source else []) + targets.split():
                if pieces.piece_to_id(piece) == pieces.unk_id() and piece != pieces.id_to_piece(pieces.unk_id()):
                    raise ValueError(f"{path}, line {number}: {piece!r} is not a piece of the run's vocabulary of "
                                     f"{vocab_size}: the shortlist was made for another tokenizer.")  # fmt: skip
                ids.append(pieces.piece_to_id(piece))
            if not tab:
                raise ValueError(f"{path}, line {number}: expected a source piece, a tab and target pieces.")
            if source:
                rows[ids[0]] = ids[1:]
            else:
                always = ids
    table = np.zeros((vocab_size, max(map(len, rows.values()), default=1)), np.int32)
    for source, targets in rows.items():
        table[source, : len(targets)] = targets
    return table, np.array(always, np.int32)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="a run folder of training.train")
    parser.add_argument("--candidates", type=int, default=CANDIDATES, help="target pieces kept for each source piece")
    parser.add_argument("--always", type=int, default=ALWAYS, help="the most frequent target pieces, always candidates")
    parser.add_argument("--sample", type=int, default=SAMPLE, help="training pairs the table is learned from")
    parser.add_argument("--iterations", type=int, default=ITERATIONS, help="EM iterations of IBM Model 1")
    args = parser.parse_args(argv)
    for name in ("candidates", "always", "sample", "iterations"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    try:
        record = learn(args.run_dir, args.candidates, args.always, args.sample, args.iterations)
    except ValueError as error:
        sys.exit(f"error: {error}")
    print(f"Learned the shortlist of {args.run_dir} from {record['pairs']:,} pairs in {record['seconds']} s: "
          f"{os.path.join(args.run_dir, 'shortlist.txt')}")  # fmt: skip


if __name__ == "__main__":
    main()
