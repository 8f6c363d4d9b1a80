"""The lab's rootfs sources come from this machine's apt configuration (recorded files here)."""

from __future__ import annotations

from gpudeploy_lab.aptsources import lab_sources, proxy_options

# This machine's /etc/apt/sources.list.d/debian.sources, 2026-12-01, and a disabled third-party repo.
DEBIAN_SOURCES = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
NODESOURCE = """Types: deb
URIs: https://deb.nodesource.com/node_20.x
Suites: nodistro
Components: main
"""
LOCAL_MIRROR_LIST = """# a local mirror behind the firewall
deb [arch=amd64 signed-by=/etc/apt/keyrings/mirror.gpg] http://mirror.internal/debian bookworm main contrib
deb-src http://mirror.internal/debian bookworm main
deb http://mirror.internal/debian trixie main
"""


def test_only_the_lab_suites_entries_are_taken() -> None:
    text = lab_sources({"/etc/apt/sources.list.d/debian.sources": DEBIAN_SOURCES,
                        "/etc/apt/sources.list.d/nodesource.sources": NODESOURCE}, "bookworm")
    assert "nodesource" not in text
    assert text.count("URIs:") == 2 and "Suites: bookworm bookworm-updates" in text
    assert "Suites: bookworm-security" in text and "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" in text
    assert "http://" in text and "deb.debian.org" in text


def test_one_line_entries_become_deb822_with_their_keyring() -> None:
    text = lab_sources({"/etc/apt/sources.list": LOCAL_MIRROR_LIST}, "bookworm")
    assert text == ("URIs: http://mirror.internal/debian\nSuites: bookworm\nComponents: main contrib\n"
                    "Signed-By: /etc/apt/keyrings/mirror.gpg\nTypes: deb\n")


def test_no_entry_for_the_suite_gives_nothing() -> None:
    assert lab_sources({"/etc/apt/sources.list.d/nodesource.sources": NODESOURCE}, "bookworm") == ""


def test_apt_proxy_settings_are_passed_on() -> None:
    dump = 'APT::Architecture "amd64";\nAcquire::http::Proxy "http://proxy.internal:3128";\n'
    assert proxy_options(dump) == ['--aptopt=Acquire::http::Proxy "http://proxy.internal:3128"']
