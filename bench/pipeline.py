"""Host input pipeline speed: read, bucket and batch (`training.data.training_batches`, what
training reads), in real target tokens per second, next to what one TPU v5e chip would consume
training the base model. Two rows: the first epoch, which tokenizes the split into shards while
it reads them (`training.tokenized.TokenizedShards`), and later epochs, which read the shards.

    python -m bench.pipeline --data ../shared/data/multi30k   # Multi30k EN-DE, 25,000-token batches

The chip's appetite is an estimate: the base model's training FLOPs a target token at 40% of the
chip's 197 bf16 TFLOP/s; `cores_per_chip` is how many host cores at this speed keep it fed.
"""

import argparse
import os
import tempfile
import time

import numpy as np

from bench.common import emit, peak_rss_mb
from bench.train_throughput import training_flops
from keras_transformer import PAD_ID, TransformerConfig
from training import data
from training.tokenized import TokenizedShards
from training.tokenizer import Tokenizer, train_sentencepiece

V5E_BF16_FLOPS = 197e12
UTILISATION = 0.4
TYPICAL_LENGTH = 32  # tokens per sentence for the FLOP estimate (attention's share grows with it)


def v5e_chip_target_tokens_per_second(vocab_size=37_000):
    """Target tokens/s one v5e chip trains the base model at, at UTILISATION of its peak."""
    config = TransformerConfig.base(vocab_size)
    flops_per_token = training_flops(config, 1, TYPICAL_LENGTH, TYPICAL_LENGTH) / TYPICAL_LENGTH
    return V5E_BF16_FLOPS * UTILISATION / flops_per_token, flops_per_token


def measure(tokenized, batch_tokens, batches, warmup):
    dataset = data.training_batches(tokenized, batch_tokens=batch_tokens, max_length=256)
    iterator = iter(dataset)
    for _ in range(warmup):  # fills the shuffle buffer and the buckets
        next(iterator)
    tokens, start = 0, time.perf_counter()
    for _ in range(batches):
        tokens += int(np.sum(next(iterator)["target_output"].numpy() != PAD_ID))
    return tokens / (time.perf_counter() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a Multi30k folder (train, val and test2016 .en / .de)")
    parser.add_argument("--batch-tokens", type=int, default=25_000)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batches", type=int, default=200, help="batches timed")
    parser.add_argument("--warmup", type=int, default=20, help="batches read before timing")
    args = parser.parse_args(argv)
    corpus = data.text_file_corpus(args.data, "en", "de", {"dev": "val", "test": "test2016"})
    chip, flops_per_token = v5e_chip_target_tokens_per_second()
    cores = os.cpu_count()
    with tempfile.TemporaryDirectory() as scratch:
        text = corpus.training_split(os.path.join(scratch, "text"))
        tokenizer = Tokenizer(train_sentencepiece([t for pair in text.sample() for t in pair], args.vocab_size))
        directory = os.path.join(scratch, "tokenized")
        start = time.perf_counter()
        TokenizedShards(text, tokenizer, os.path.join(scratch, "tokenized-alone")).write_all()
        tokenize_seconds = time.perf_counter() - start
        for mode in ("first_epoch", "later_epochs"):
            tokenized = TokenizedShards(text, tokenizer, directory)
            tokens_per_second = measure(tokenized, args.batch_tokens, args.batches, args.warmup)
            tokenized.close()
            tokenized.write_all()  # the rest, for the later epochs' row
            emit({"benchmark": "pipeline", "mode": mode, "corpus": corpus.name, "batch_tokens": args.batch_tokens,
                  "tgt_tokens_per_s": round(tokens_per_second),
                  "tgt_tokens_per_s_per_core": round(tokens_per_second / cores),
                  "v5e_chip_tgt_tokens_per_s_estimate": round(chip),
                  "base_training_flops_per_tgt_token": round(flops_per_token),
                  "cores_per_chip": round(chip / (tokens_per_second / cores), 1),
                  "tokenize_split_seconds": round(tokenize_seconds, 1), "pairs": text.num_pairs,
                  "peak_rss_mb": round(peak_rss_mb(), 1)})  # fmt: skip


if __name__ == "__main__":
    main()
