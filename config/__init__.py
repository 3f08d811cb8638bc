"""mibyan's configuration: built-in defaults, user and project files, environment, flags."""

from config.loader import load_settings

__all__ = ["load_settings"]
