"""Benchmarks behind ``kvcodec bench``: each reports ratios to a baseline and to the physical
ceiling measured in the same run, never a bare absolute time."""
