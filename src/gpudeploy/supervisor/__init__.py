"""Supervisors: what starts gpudeploy's servers on a host, names each run and reports on it."""
