"""The reference row of bench/train_throughput.py: PyTorch's `nn.Transformer` of the same shape,
trained on the same batch with the same optimizer, so that a ratio is measured in one run.

PyTorch is a bench-only, optional dependency (`pip install torch`); without it the row is
skipped with a message. The model: a shared embedding scaled by sqrt(d_model) plus sinusoids,
`nn.Transformer` (post-norm, ReLU, dropout as configured; it adds a final LayerNorm to each
stack), logits from the embedding matrix; label-smoothed cross-entropy over non-padding tokens;
Adam(0.9, 0.98, 1e-9). One step is forward, backward and update, on all host threads.
"""

import math
import os

from bench.common import time_call


def step_seconds(config, source, target_input, target_output, steps, repeats):
    """Median seconds of one training step, or None when PyTorch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count())
    model = _model(torch, config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    source, target_input, target_output = (torch.as_tensor(x, dtype=torch.long) for x in (source, target_input, target_output))

    def run(count):
        for _ in range(count):
            optimizer.zero_grad(set_to_none=True)
            logits = model(source, target_input)
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), target_output.reshape(-1))
            loss.backward()
            optimizer.step()
        return float(loss)

    return time_call(lambda: run(steps), repeats) / steps


def _model(torch, config):
    class TorchTransformer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            d = config.d_model
            self.scale = math.sqrt(d)
            self.embedding = torch.nn.Embedding(config.vocab_size, d)
            torch.nn.init.normal_(self.embedding.weight, std=d**-0.5)
            self.transformer = torch.nn.Transformer(
                d_model=d, nhead=config.num_heads, num_encoder_layers=config.encoder_layers,
                num_decoder_layers=config.decoder_layers, dim_feedforward=config.d_ff, dropout=config.dropout,
                batch_first=True,
            )  # fmt: skip
            position = torch.arange(config.max_length)[:, None]
            angle = position / torch.pow(10000.0, torch.arange(0, d, 2) / d)
            encoding = torch.zeros(config.max_length, d)
            encoding[:, 0::2], encoding[:, 1::2] = torch.sin(angle), torch.cos(angle)
            self.register_buffer("encoding", encoding)

        def embed(self, ids):
            return self.embedding(ids) * self.scale + self.encoding[: ids.shape[1]]

        def forward(self, source, target):
            causal = torch.nn.Transformer.generate_square_subsequent_mask(target.shape[1])
            hidden = self.transformer(
                self.embed(source), self.embed(target), tgt_mask=causal, tgt_is_causal=True,
                src_key_padding_mask=source == 0, memory_key_padding_mask=source == 0,
            )  # fmt: skip
            return hidden @ self.embedding.weight.T

    return TorchTransformer()
