"""The real-model corpus: tiny configs of Hugging Face models, built offline with random weights."""
