"""torch's higher-order ops, custom autograd Functions, hooks and the other extension points."""
