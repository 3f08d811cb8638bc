"""`mibyan web`: a local page to browse, search and watch the stored sessions (see `serve`)."""
