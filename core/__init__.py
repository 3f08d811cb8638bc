"""The ground floor of mibyan: what every other floor may use, and which imports nothing of mibyan above it.

Errors, output sanitising, secret masking, exit codes, the interruptible call, the HTTP transport, the
loopback and listening helpers, and the text of stored sessions shared by the CLI and the viewer.
"""
