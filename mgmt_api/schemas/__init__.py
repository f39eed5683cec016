"""Pydantic models of the wire format (camelCase JSON); they generate the OpenAPI."""
