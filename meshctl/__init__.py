"""meshctl package."""
