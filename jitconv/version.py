"""jitconv's version (a leaf module: the kernel cache key reads it)."""

__version__ = "0.1.0"
