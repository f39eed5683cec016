"""Authentication: local passwords, management-plane tokens, service-account keys."""
