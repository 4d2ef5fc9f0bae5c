"""Errors raised by attnprobe. Each message is one line that says what to do."""


class AttnProbeError(Exception):
    """Base class for every attnprobe error."""


class InputError(AttnProbeError, ValueError):
    """Bad user input: empty text, too many tokens, indices out of range, ..."""


class ModelNotFoundError(AttnProbeError, FileNotFoundError):
    """A model name or path that is neither registered nor on disk."""


class AttentionUnavailableError(AttnProbeError, RuntimeError):
    """The model's attention cannot be captured through any supported seam."""


class HookNotFiredError(AttnProbeError, RuntimeError):
    """A hook (or attention site) that was asked for never ran during the forward."""


class EditNotAppliedError(AttnProbeError, RuntimeError):
    """An attention edit that did not change what the model computed."""


class MissingExtraError(AttnProbeError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


class OutputError(AttnProbeError, OSError):
    """An output that cannot or must not be written (collision, directory, unwritable)."""


class FileFormatError(AttnProbeError, ValueError):
    """A file to read that is malformed, too large or not what it claims to be."""
