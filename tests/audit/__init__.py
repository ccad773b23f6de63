"""The schema audit and what export does with the composites it judges."""
