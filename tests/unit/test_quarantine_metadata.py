"""What Search and AssembleContext say about quarantined matches: a legal metadata value whatever
the scan recorded, and no operator detail (addresses, paths, load errors) told to a tenant."""

from __future__ import annotations

import re

from entrypoints.api.context_servicer import quarantine_metadata
from projections.reads.quarantined_matches import MAX_COUNTED, Quarantined

LOAD_ERROR = ("DetectPII at 10.0.0.7:50052 failed with UNAVAILABLE: gliner-small-v2.1 is unavailable: weights "
              "could not be loaded (RuntimeError: Error(s) in loading state_dict:\n\tMissing key(s) \u00e9\x7f)")


def test_nothing_held_back_is_a_zero_count_and_no_reason():
    assert quarantine_metadata(Quarantined(0)) == (("engine.quarantined_matches", "0"),)
    assert Quarantined(0).describe() == ""


def test_the_reason_is_the_status_alone_and_a_legal_metadata_value():
    pairs = dict(quarantine_metadata(Quarantined(2, LOAD_ERROR)))
    assert pairs["engine.quarantined_matches"] == "2"
    reason = pairs["engine.quarantine_reason"]
    assert reason.startswith("2 matching items quarantined by the PII scan (the PII detector answered UNAVAILABLE)")
    assert re.fullmatch(r"[\x20-\x7e]{1,512}", reason)
    assert "10.0.0.7" not in reason and "state_dict" not in reason and "pii rescan" in reason


def test_other_reasons_and_the_cap():
    assert "(the PII detector failed)" in Quarantined(1, "TimeoutError: \n").describe()
    assert "(no PII detector answered)" in Quarantined(1).describe()
    assert Quarantined(MAX_COUNTED, LOAD_ERROR).describe().startswith(f"{MAX_COUNTED}+ matching items")
