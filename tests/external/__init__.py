"""Code nobody here wrote: PyTorch's test databases and TestExport, Hugging Face models."""
