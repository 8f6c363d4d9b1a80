"""``invoke status`` reads hosts through OpenSSH: its code path imports neither paramiko nor fabric
(~40 ms of every status, a tenth of a 3-host status on this machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_status_and_the_openssh_transport_do_not_import_paramiko() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import gpudeploy.verify.status, gpudeploy.remote.openssh; "
            "print(sorted(m for m in ('paramiko', 'fabric') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(SRC)], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    assert out.strip() == "[]"


def test_trust_still_offers_the_file_rules_it_shares_with_openssh() -> None:
    from gpudeploy.remote import knownhosts, trust

    assert trust.openssh_options is knownhosts.openssh_options and trust.all_files is knownhosts.all_files
    assert trust.SYSTEM_FILES == knownhosts.SYSTEM_FILES
