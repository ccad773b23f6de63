"""Before the trace: the forms of input forward takes (pytrees, keyword and variadic arguments)."""
