"""Sampling: which sample sits at each position of an epoch, as pure, versioned functions (docs/ORDER.md).
"""
