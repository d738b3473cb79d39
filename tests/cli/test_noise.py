"""The dependencies' messages that look like failures in a healthy run are dropped; others show."""

from __future__ import annotations

import logging
import warnings

import pytest

from p2prl.cli.noise import quiet_dependencies


def test_known_deprecations_are_dropped_and_nothing_else(caplog: pytest.LogCaptureFixture) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_dependencies()
        msg = (
            "`past_key_values` is deprecated and will be removed in version 5.40.0 for `Qwen2Model.forward`."
        )
        warnings.warn(msg + " Use `cache` instead.", FutureWarning, stacklevel=1)
        warnings.warn("`other` is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["`other` is deprecated"]
    lg = logging.getLogger("transformers.utils.generic")
    with caplog.at_level(logging.WARNING, logger="transformers.utils.generic"):
        lg.warning("`past_key_values`/`cache_params` are deprecated. Use `cache` instead.")
        lg.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]
    for f in list(lg.filters):
        lg.removeFilter(f)
