"""``python -m kvcodec_sdk.daemon``: the same as ``kvcodec daemon``."""

import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["daemon", *sys.argv[1:]]))
