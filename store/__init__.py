"""The session store's parts: its repositories, the database seam they use, and the SQLite backend.

`agent_state.SessionStore` puts them together; import that. See store/database.py for what a backend
and its dialect provide.
"""
