"""The test OpenID Provider (npm ``oidc-provider``) and its Python launcher."""
