"""mibyan's configuration: built-in defaults, user and project files, environment, flags.

Import `config.loader` for `load_settings` (it pulls in pydantic and yaml); `config.paths` and
`config.trust` (which project files the user trusts) are light.
"""
