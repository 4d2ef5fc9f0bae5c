"""The attnprobe version (recorded with every result)."""

__version__ = "0.1.0"
