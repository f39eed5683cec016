"""HTTP adapters: thin FastAPI routers over the service layer."""
