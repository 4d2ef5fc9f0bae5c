"""The ``attnprobe`` sub-commands, one module per analysis family; each has
``register(subparsers)``. Shared option handling is in :mod:`attnprobe.commands.common`."""
