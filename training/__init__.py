"""From parallel text to an evaluated checkpoint: tokenizer, data, training, evaluation."""
