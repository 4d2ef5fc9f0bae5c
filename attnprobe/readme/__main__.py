"""``python -m attnprobe.readme``: rewrite the README's generated parts (``make readme``)."""

from attnprobe.readme import main

changed = main()
print(f"README parts rewritten: {', '.join(changed) if changed else 'none (already current)'}")
