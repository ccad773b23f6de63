"""The audit's verdicts, by name: what an entry of a table says, without the checker that
found it (reading a shipped table during an export should not import the auditing code)."""

LIES_ALIAS = "lies_alias"
LIES_MUTATION = "lies_mutation"
MAYBE_ALIAS = "maybe_alias"
HONEST = "honest"
UNTESTED = "untested"
VERDICTS = (LIES_ALIAS, LIES_MUTATION, MAYBE_ALIAS, HONEST, UNTESTED)
