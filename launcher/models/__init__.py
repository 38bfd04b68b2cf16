"""Model architectures: the catalog, Hugging Face config reading, exact parameter counts."""
