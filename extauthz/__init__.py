"""extauthz package."""
