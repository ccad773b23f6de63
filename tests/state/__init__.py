"""State outside the functional view: .data, parameters and buffers written or replaced, tied weights."""
