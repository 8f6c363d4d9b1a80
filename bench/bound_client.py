"""The least a Python command on invoke can do to run anything on N hosts over fresh connections,
with no gpudeploy code (issue 26): start, import invoke (what ``invoke deploy`` imports before it
reads any task of ours), then either import paramiko and, one thread per host, connect with the lab's
key and known_hosts and run ``true`` there (``paramiko``), or start the system's ``ssh host true``
for every host at once (``openssh``: the floor itself, after invoke's import). ``paramiko-python``
runs the host's ``/usr/bin/python3 -c pass`` instead of ``true``: gpudeploy's work on a host (its
lock's holder, the probe) is a python there. ``bench/ab.py --bounds`` and ``bench/fleet.py`` time
them beside the floor and a redeploy: no redeploy can be quicker than the quicker of the first two,
none that runs a python on each host quicker than the third.

    python bench/bound_client.py paramiko|openssh|paramiko-python KEY KNOWN_HOSTS ADDRESS...
"""

from __future__ import annotations

import subprocess
import sys
import threading

import invoke  # noqa: F401  (imported by `invoke` before it reads any task)


def over_openssh(key: str, known: str, addresses: list[str]) -> int:
    procs = [subprocess.Popen(["ssh", "-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                               "-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null",
                               "-o", "StrictHostKeyChecking=yes", f"root@{a}", "true"]) for a in addresses]
    return max(p.wait() for p in procs)


def over_paramiko(key: str, known: str, addresses: list[str], command: str = "true") -> int:
    import paramiko

    codes: list[int] = []

    def one(address: str) -> None:
        client = paramiko.SSHClient()
        client.load_host_keys(known)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(address, username="root", key_filename=key, look_for_keys=False, allow_agent=False,
                           timeout=30)
            _, out, _ = client.exec_command(command)
            codes.append(out.channel.recv_exit_status())
        except Exception as exc:  # a bench: say which host and go on
            print(f"{address}: {exc}", file=sys.stderr)
            codes.append(255)
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(a,)) for a in addresses]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return max(codes)


def main() -> None:
    way, key, known, *addresses = sys.argv[1:]
    if way == "openssh":
        raise SystemExit(over_openssh(key, known, addresses))
    raise SystemExit(over_paramiko(key, known, addresses, "/usr/bin/python3 -c pass" if way == "paramiko-python"
                                   else "true"))


if __name__ == "__main__":
    main()
