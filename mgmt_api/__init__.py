"""mgmt_api package."""
