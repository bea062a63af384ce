"""The stored conversation data: what agents sent and what the tasks derive from it."""
