"""The old name of tests/joint/reference.py (issue 40: the judge is "the reference"),
kept while branches that import it are merged; import tests.joint.reference instead."""

import sys

from tests.joint import reference

sys.modules[__name__] = reference
