"""A worker that stops making progress in one of the ways a training rank
does, for the stack tests: `sleep` (a data loader waiting), `spin` (a Python
loop that never ends), `pipe` (a read that never returns). Prints "ready"
once it is in place."""
import os
import sys
import time


def load_batch():
    print("ready", flush=True)
    time.sleep(3600)  # LINE-SLEEP


def busy_loop():
    print("ready", flush=True)
    x = 0
    while True: x = (x + 1) % 7  # LINE-SPIN  # noqa: E701


def read_pipe():
    r, _w = os.pipe()
    print("ready", flush=True)
    os.read(r, 1)  # LINE-PIPE


if __name__ == "__main__":
    {"sleep": load_batch, "spin": busy_loop, "pipe": read_pipe}[sys.argv[1]]()
