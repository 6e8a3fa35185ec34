import pytest

from trainyard.core.health import XID_CATALOG, XID_CATALOG_VERSION, Remedy, Severity, classify_xid


@pytest.mark.parametrize(
    "xid, severity, action",
    [
        pytest.param(79, Severity.FATAL, Remedy.DRAIN_NOW, id="XID 79: GPU fell off the bus, drain the node at once"),
        pytest.param(48, Severity.FATAL, Remedy.RESET_GPU, id="XID 48: double-bit ECC error needs a GPU reset"),
        pytest.param(95, Severity.FATAL, Remedy.RESET_GPU, id="XID 95: uncontained ECC error needs a GPU reset"),
        pytest.param(94, Severity.INFO, Remedy.RESTART_JOB, id="XID 94: contained ECC error only restarts the job"),
        pytest.param(
            13, Severity.INFO, Remedy.RESTART_JOB, id="XID 13: graphics engine exception is the application's"
        ),
        pytest.param(31, Severity.INFO, Remedy.RESTART_JOB, id="XID 31: MMU fault is the application's"),
        pytest.param(43, Severity.INFO, Remedy.IGNORE, id="XID 43: stopped channel leaves the GPU healthy"),
        pytest.param(63, Severity.SUSPECT, Remedy.RESET_GPU, id="XID 63: row remap recorded, reset at the next chance"),
        pytest.param(64, Severity.FATAL, Remedy.DRAIN_NOW, id="XID 64: row remap failure means replacing the GPU"),
        pytest.param(74, Severity.FATAL, Remedy.RESET_GPU, id="XID 74: NVLink error needs a GPU reset"),
        pytest.param(92, Severity.SUSPECT, Remedy.RESET_GPU, id="XID 92: high single-bit ECC rate is suspect"),
        pytest.param(119, Severity.FATAL, Remedy.RESET_GPU, id="XID 119: GSP RPC timeout needs a GPU reset"),
        pytest.param(120, Severity.FATAL, Remedy.REBOOT_NODE, id="XID 120: GSP error needs a reboot"),
        pytest.param(140, Severity.FATAL, Remedy.RESET_GPU, id="XID 140: unrecovered ECC error needs a GPU reset"),
    ],
)
def test_catalog_entry(xid, severity, action):
    rule = classify_xid(xid)
    assert (rule.xid, rule.severity, rule.action) == (xid, severity, action)
    assert rule.description


@pytest.mark.parametrize(
    "xid", [pytest.param(9999, id="an XID far beyond the catalog"), pytest.param(0, id="XID 0, never assigned")]
)
def test_unknown_xid_is_suspect_not_ignored_nor_fatal(xid):
    rule = classify_xid(xid)
    assert rule.severity == Severity.SUSPECT
    assert rule.action != Remedy.IGNORE
    assert XID_CATALOG_VERSION in rule.description


def test_catalog_is_keyed_by_its_own_xids_and_every_entry_is_described():
    assert all(key == rule.xid and rule.description for key, rule in XID_CATALOG.items())
    assert XID_CATALOG_VERSION.startswith("xid-catalog-")
