"""mibyan in editors: the Agent Client Protocol (`mibyan acp`), so Zed, JetBrains IDEs, Neovim and Emacs
run mibyan as their agent. server.py is the protocol's agent side; bridge.py turns the agent's callbacks
into session updates; stdio.py keeps stdout for the protocol alone."""
