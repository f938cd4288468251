"""Hook specifications of the ``kvcodec`` plugin system.

A plugin is a module (or object) with functions marked ``@kvcodec_sdk.hookimpl``, published
through an entry point in the group ``kvcodec``::

    [project.entry-points.kvcodec]
    mycodec = "kvcodec_mycodec.plugin"

Entry points are loaded lazily on the first registry lookup. ``KVCODEC_DISABLE_PLUGINS`` (a
comma-separated list of entry-point names) keeps named plugins from loading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .registry import CodecRegistry

PROJECT_NAME = "kvcodec"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def kvcodec_register_codecs(registry: CodecRegistry) -> None:
    """Register the codecs this plugin provides.

    Called once per registry, after every enabled plugin is loaded. Call
    :meth:`~kvcodec_sdk.CodecRegistry.register` with one
    :class:`~kvcodec_sdk.spec.CodecSpec` per codec. A name registered twice keeps the first
    registration and warns, naming both plugins.

    :param registry: The registry being populated.
    """
