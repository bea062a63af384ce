"""Django's SQLite backend with the writers queued in the kernel: see ``base``."""
