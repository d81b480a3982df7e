"""A worker that fails with a Python exception under torch.distributed.elastic's
@record, which writes it to TORCHELASTIC_ERROR_FILE; rank 0 waits to be stopped."""
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("learning rate must be positive, got -0.1")
    time.sleep(60)


if __name__ == "__main__":
    main()
