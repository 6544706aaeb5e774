"""Progress of a long phase (cutting text files, tokenizing a split), printed as lines: the
terminal's progress bar is training's, and a line a phase stays readable in a log file."""

import time

PROGRESS_SECONDS = 15  # a long phase prints a line at most this often


class Progress:
    """Prints `what: done of total unit (percent), rate unit/s, ETA` every `PROGRESS_SECONDS`
    while a phase runs, and how long it took at the end if that was long enough to show."""

    def __init__(self, what, total, unit="pairs", every=PROGRESS_SECONDS):
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.start = self.last = time.monotonic()
        self.done = 0

    def update(self, done, measure=None):
        """`done` units so far; `measure` (0-1) is the share done when `done` alone does not say it."""
        self.done = done
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        share = measure if measure is not None else done / self.total if self.total else None
        line = f"{self.what}: {done:,} {self.unit}"
        if share:
            line += f" ({100 * share:.0f}%), {rate:,.0f} {self.unit}/s, ETA {duration((now - self.start) * (1 - share) / share)}"
        else:
            line += f", {rate:,.0f} {self.unit}/s"
        print(line, flush=True)

    def finish(self):
        seconds = time.monotonic() - self.start
        if seconds >= self.every:
            print(f"{self.what}: {self.done:,} {self.unit} in {duration(seconds)}.", flush=True)


def duration(seconds):
    """`seconds` as a person reads them: "45 s", "3 min 20 s"."""
    return f"{seconds / 60:.0f} min {seconds % 60:.0f} s" if seconds >= 60 else f"{seconds:.0f} s"
