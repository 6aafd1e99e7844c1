"""Test-wide settings.

Hypothesis runs derandomised (a fixed example sequence derived from each test), so `make test` and CI
explore the same cases every run; set HYPOTHESIS_PROFILE=explore to search with fresh randomness.
"""

import os

import pytest
from hypothesis import settings

settings.register_profile("default", derandomize=True, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def default_dataset():
    """The default Bursted build (shipped Mooncake base, ``preset="default"``, seed 0), built once
    per test session: every test that needs it shares this object (treat it as read-only)."""
    from btb_core import synth

    return synth.build(None, "default", seed=0)
