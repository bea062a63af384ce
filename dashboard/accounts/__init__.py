"""Projects, their members and their API keys."""
