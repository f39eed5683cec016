"""meshplane package."""
