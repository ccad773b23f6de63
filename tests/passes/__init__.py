"""After the trace: write-back guards, node metadata (custom annotations, stack traces)."""
