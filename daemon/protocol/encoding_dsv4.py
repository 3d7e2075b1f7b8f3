"""Moved to daemon/protocol/dsv4/encoding.py (issue 43). This name stays, as the same module object,
for daemon/modelgen/make_model.py (its V4 template reads the encoder's constants); import the new
path elsewhere."""

import sys

from .dsv4 import encoding as _encoding

sys.modules[__name__] = _encoding
