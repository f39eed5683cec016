"""Persistence on SQLAlchemy 2 Core: SQLite (default) and PostgreSQL."""
