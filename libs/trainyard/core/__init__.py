"""The functional core: pure, synchronous, deterministic policy.

Nothing here performs I/O, reads a clock, draws random numbers or logs.  Every
entry point takes a snapshot and returns decisions plus a reason for every job
it leaves waiting.  Only the standard library, msgspec and trainyard.domain /
trainyard.events may be imported here (a test enforces it).
"""
