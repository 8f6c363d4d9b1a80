"""A tiny SSH server for tests that must not touch the lab: publickey auth, ``exec``, ``direct-tcpip``.

    python fake_sshd.py ADDRESS PORT HOST_KEY AUTHORIZED_PUBKEY NAME [--run]

Prints ``listening`` once bound, then ``direct-tcpip ADDRESS PORT`` for each relay it opens.
``exec`` of ``true`` exits 0, ``hostname`` prints NAME, ``never-answer`` is a request the server
never answers (a link that went down after the request left: no reply, no close), ``disconnect``
ends the connection with SSH_MSG_DISCONNECT as sshd does ("Timeout, client not responding"), anything else
exits 127; with ``--run``, anything else runs here under ``sh -c`` as a real sshd would run it
(stdin, stdout, stderr and the exit status carried); ``exec`` is printed when it starts and
``exit RC`` when it ends.
``direct-tcpip``
(what ``ssh -W`` / ProxyJump asks of a bastion) connects from this process's network namespace and
relays bytes both ways. Runs until killed.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import subprocess
import sys
import threading
from typing import Any

import paramiko


class Server(paramiko.ServerInterface):
    def __init__(self, authorized: paramiko.PKey, name: str) -> None:
        self.authorized = authorized
        self.name = name
        self.commands: dict[int, bytes] = {}
        self.arrived = threading.Condition()  # a channel's exec request came (one master, many sessions)

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = username == "root" and key.get_base64() == self.authorized.get_base64()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_direct_tcpip_request(self, chanid: int, origin: Any, destination: tuple[str, int]) -> int:
        self.commands[chanid] = b"direct-tcpip %s %d" % (destination[0].encode(), destination[1])
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        with self.arrived:
            self.commands[channel.get_id()] = command
            self.arrived.notify_all()
        if command == b"never-answer":
            threading.Event().wait()  # this connection's transport thread: no answer ever goes out
        return True


def pump(src: Any, dst: Any) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for end in (src, dst):
            with contextlib.suppress(OSError):
                end.close()


def run(chan: paramiko.Channel, command: bytes) -> None:
    """``command`` under ``sh -c`` on this machine, its stdin, stdout and stderr carried by ``chan``."""
    print("exec", flush=True)
    proc = subprocess.Popen(["sh", "-c", command.decode()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            while data := chan.recv(65536):
                proc.stdin.write(data)
                proc.stdin.flush()
        with contextlib.suppress(OSError):
            proc.stdin.close()  # the client's EOF

    def carry(src: Any, send: Any) -> None:
        while data := src.read1(65536):
            send(data)

    threads = [threading.Thread(target=feed, daemon=True),
               threading.Thread(target=carry, args=(proc.stdout, chan.sendall), daemon=True),
               threading.Thread(target=carry, args=(proc.stderr, chan.sendall_stderr), daemon=True)]
    for t in threads:
        t.start()
    rc = proc.wait()
    for t in threads[1:]:
        t.join()
    print(f"exit {rc}", flush=True)
    with contextlib.suppress(OSError, EOFError):
        chan.send_exit_status(rc)
        chan.close()


def serve(conn: socket.socket, host_key: paramiko.PKey, authorized: paramiko.PKey, name: str,
          run_commands: bool) -> None:
    transport = paramiko.Transport(conn)
    transport.add_server_key(host_key)
    server = Server(authorized, name)
    transport.start_server(server=server)
    while transport.is_active():
        chan = transport.accept(timeout=30)
        if chan is None:
            break
        command = server.commands.get(chan.get_id(), b"")
        if command.startswith(b"direct-tcpip "):
            _, addr, port = command.decode().split()
            print(f"direct-tcpip {addr} {port}", flush=True)  # which way a jump went, for the tests
            try:
                target = socket.create_connection((addr, int(port)), timeout=5)
            except OSError:
                chan.close()
                continue
            threading.Thread(target=pump, args=(chan, target), daemon=True).start()
            threading.Thread(target=pump, args=(target, chan), daemon=True).start()
            continue
        chanid = chan.get_id()
        with server.arrived:
            server.arrived.wait_for(lambda: chanid in server.commands, timeout=5)  # noqa: B023 (used here only)
        command = server.commands.get(chanid, b"")
        if command == b"never-answer":
            continue  # left open: neither an answer nor a close
        if command == b"disconnect":
            bye = paramiko.Message()
            bye.add_byte(paramiko.common.cMSG_DISCONNECT)
            bye.add_int(11)  # SSH2_DISCONNECT_BY_APPLICATION, what sshd's packet_disconnect() sends
            bye.add_string("Timeout, client not responding from user root 127.0.0.1 port 40000")
            bye.add_string("")
            transport._send_message(bye)
            transport.close()
            return
        if command == b"true":
            chan.send_exit_status(0)
        elif command == b"hostname":
            chan.sendall((name + "\n").encode())
            chan.send_exit_status(0)
        elif run_commands:
            threading.Thread(target=run, args=(chan, command), daemon=True).start()
            continue
        else:
            chan.send_exit_status(127)
        chan.close()


def main() -> None:
    address, port, key_file, authorized_file, name = sys.argv[1:6]
    run_commands = sys.argv[6:] == ["--run"]
    host_key = paramiko.Ed25519Key.from_private_key_file(key_file)
    with open(authorized_file) as f:
        blob = f.read().split()[1]
    authorized = paramiko.Ed25519Key(data=base64.b64decode(blob))
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, int(port)))
    listener.listen()
    print("listening", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, host_key, authorized, name, run_commands),
                         daemon=True).start()


if __name__ == "__main__":
    main()
