"""`mibyan gateway`: the configured agents served over connectors, one session per channel."""
