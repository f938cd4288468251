"""Benchmarks behind ``kvcodec bench``: each reports ratios to a baseline and to the physical
ceiling measured in the same run, never a bare absolute time.

Helpers serve benchmark scripts too (the plugins' own): :func:`wall_times` times a call, a
:class:`Table` of :class:`Column` holds a report's cells, :func:`emit` prints it and writes the
JSON report (:func:`write_json`).
"""

from ._common import Column, Table, emit, wall_times, write_json

__all__ = ["Column", "Table", "emit", "wall_times", "write_json"]
