"""The DDP script of ddp_train.py behind the command line a user's script
has (argparse: --backend, --steps), as torchrun runs it: `torchrun [...]
ddp_args.py --backend gloo --steps 10`. Refuses a backend other than gloo
(this machine has no GPU)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_train  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gloo", choices=["gloo"])
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    os.environ["STEPS"] = str(args.steps)
    ddp_train.main()


if __name__ == "__main__":
    main()
