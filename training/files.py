"""Files that several processes share, on any file system `tf.io.gfile` reads (a bucket too):
writing aside and renaming into place, waiting for another process' file, cleaning up what a
killed process was writing; and reading local text files (gzip or plain, checked UTF-8)."""

import gzip
import os
import socket
import time

import tensorflow as tf

from training.progress import duration

# How long a process waits for another's file before it gives up.
WAIT_MINUTES = 60
_HOST = socket.gethostname().replace("-", "_")  # in the names of files being written


def aside(path, tag="tmp"):
    """Where `path` is written before it is renamed into place: DIR/.NAME.TAG. Not DIR/NAME.TAG,
    which some filesystems (TensorFlow's ram://) take for a folder holding DIR/NAME."""
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.{tag}")


def wait_for(path, what, minutes=WAIT_MINUTES):
    """Waits until `path` exists: another process (`what` it waits for) makes it in a folder that
    all share. Says so every minute; raises after `minutes`."""
    start = time.monotonic()
    while not tf.io.gfile.exists(path):
        waited = time.monotonic() - start
        if waited > 60 * minutes:
            raise TimeoutError(f"Waited {minutes} minutes for {what} ({path}): do all processes share the run "
                               "folder (a bucket, for several hosts)?")  # fmt: skip
        if waited // 60 > (waited - 1) // 60:
            print(f"Waiting for {what} ({duration(waited)} so far).", flush=True)
        time.sleep(1)


def open_text(path):
    """A text file for reading bytes, gunzipped on the fly if its name ends in .gz."""
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist.")
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def check_utf8(joined, path, first_line):
    """Raises a ValueError naming `path` and the line if a line of `joined` (whole lines, as
    bytes; the first is line `first_line`) is not UTF-8. Checks them at once: a line at a time is
    slow."""
    try:
        joined.decode("utf-8")
    except UnicodeDecodeError as error:
        line = first_line + joined.count(b"\n", 0, error.start)
        byte = error.start - joined.rfind(b"\n", 0, error.start) - 1
        raise ValueError(f"{path}, line {line}: not valid UTF-8 ({error.reason} at byte {byte}).") from None


def staging_path(path):
    """Where this process writes `path` before renaming it into place: aside, tagged with its host
    and process id, so that `remove_abandoned` knows whose it is."""
    return aside(path, f"tmp-{_HOST}-{os.getpid()}")


def remove_abandoned(directory):
    """Removes the `staging_path` files in `directory` of processes of this host that are gone
    (killed while writing)."""
    for name in tf.io.gfile.listdir(directory):
        host, _, pid = name.partition(".tmp-")[2].rpartition("-")
        if host == _HOST and pid.isdigit() and not _alive(int(pid)):
            tf.io.gfile.remove(os.path.join(directory, name))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
