"""pf.verify: the replay against the reference over calls, hidden writes, a report on every program."""
