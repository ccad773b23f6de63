"""What we assume of torch: drift of restated internals, error texts, private APIs."""
