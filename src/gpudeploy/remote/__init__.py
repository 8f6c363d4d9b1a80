"""The transport: how gpudeploy runs commands on a host, streams their output and writes files.

``ssh.Remote`` (fabric/paramiko) carries deploy, teardown, logs and the gate; ``openssh`` reads
status facts through the system's OpenSSH client with connection sharing. Both trust exactly the
same host keys (``trust``).
"""
