# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The schedule filter's decisions, one small function each, listed in one table (DECISIONS)."""
