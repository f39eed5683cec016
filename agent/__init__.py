"""meshplane-agent: the cluster agent (inventory up, proxy diagnostics down, one tunnel)."""
