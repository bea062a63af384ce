"""Config the admin edits (compression, output levels, encoder margins, retention)
and the service that turns it into the effective config agents fetch."""
