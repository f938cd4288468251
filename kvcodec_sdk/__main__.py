"""``python -m kvcodec_sdk`` runs the ``kvcodec`` command line."""

import sys

from .cli import main

sys.exit(main())
