"""A worker that stops making progress in one of the ways a training rank
does, for the stack tests: `sleep` (a data loader waiting), `spin` (a Python
loop that never ends), `pipe` (a read that never returns). Prints "ready"
on the line of the call it then stays in, so that a traceback taken at any
time after "ready" names that line."""
import os
import sys
import time


def load_batch():
    print("ready", flush=True); time.sleep(3600)  # LINE-SLEEP  # noqa: E702


def busy_loop():
    x, said = 0, False
    while True: x = (x + 1) % 7; said = said or print("ready", flush=True) or True  # LINE-SPIN  # noqa: E701,E702,E501


def read_pipe():
    r, _w = os.pipe()
    print("ready", flush=True); os.read(r, 1)  # LINE-PIPE  # noqa: E702


if __name__ == "__main__":
    {"sleep": load_batch, "spin": busy_loop, "pipe": read_pipe}[sys.argv[1]]()
