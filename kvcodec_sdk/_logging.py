"""The C++ core's messages in Python's :mod:`logging`, on the ``kvcodec_sdk.native`` logger.

The core queues a message from whichever thread writes it (a disk I/O thread included) and the
interpreter delivers it on the main thread with the GIL held, so no native thread ever waits
for the GIL; ``_native.flush_log()`` delivers the queue at once. At exit the core writes to
stderr again.
"""

from __future__ import annotations

import atexit
import logging

from . import _native

LOGGER = logging.getLogger("kvcodec_sdk.native")


def _handle(level: int, message: str) -> None:
    LOGGER.log(level, message)


def install() -> None:
    """Routes the core's messages to :data:`LOGGER` (until the interpreter exits)."""
    _native.set_log_handler(_handle)
    atexit.register(_native.set_log_handler, None)
