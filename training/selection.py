"""Model selection by dev BLEU during training (`--keep-best`, `--early-stop`, `--min-delta`): the
best evaluation so far and the evaluations since, which the run folder keeps (best/best.json) so
that a resume goes on counting. Keras' EarlyStopping rule: an evaluation improves on the best
when it is higher by at least `min_delta` (by anything, for 0); `patience` evaluations in a row
that do not end training."""

import dataclasses


@dataclasses.dataclass
class Selection:
    patience: int | None = None  # None: never stop
    min_delta: float = 0.0
    bleu: float | None = None  # the best dev BLEU so far, and its step
    step: int | None = None
    since: int = 0  # evaluations since the best

    def update(self, step, bleu):
        """Takes the dev BLEU of `step`; returns whether it is the new best."""
        improved = self.bleu is None or (round(bleu - self.bleu, 6) >= self.min_delta if self.min_delta else bleu > self.bleu)
        if improved:
            self.bleu, self.step, self.since = bleu, step, 0
        else:
            self.since += 1
        return improved

    @property
    def stop(self):
        return self.patience is not None and self.since >= self.patience

    def record(self):
        return {"step": self.step, "bleu": self.bleu, "since": self.since}
