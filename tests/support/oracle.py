"""The old name of tests/support/reference.py (issue 40: the judge is "the reference"),
kept while branches that import it are merged; import tests.support.reference instead."""

import sys

from tests.support import reference

sys.modules[__name__] = reference
