"""gpudeploy's tasks in its own repository: ``invoke TASK`` runs what the ``gpudeploy`` command runs
(src/gpudeploy/cli/tasks.py, one collection for both), plus the lab's tasks (src/gpudeploy_lab, not
part of the installed package).

    invoke init       --host ADDR [--host ADDR ...] [--out inventory/hosts.yml] [--force]
    invoke init       --example [--out inventory/hosts.yml] [--force]
    invoke roles      [--inventory F] [--json]
    invoke plan       [--host H] [--role R] [--json] [--suggest] [--files]
    invoke deploy     [--host H] [--role R] [--deployment D] [--check] [--force] [--timeout S] [--keep-on-failure]
                      [--rolling | --no-rolling] [--allow-downtime]
    invoke status     [--host H] [--role R] [--deployment D] [--json] [--watch]
    invoke teardown   [--host H] [--role R] [--deployment D] [--purge]
    invoke logs       --host H --role R [--follow]
    invoke facts      [--host H] [--json]
    invoke render     --target k8s [--out DIR] [--deployment D] [--image IMAGE] [--model-pvc NAME]
    invoke experiment --file F [--dry-run] [--resume] [--timeout S]
    invoke experiment.show --file F [--json] [--plot PNG]
    invoke tune       --file F [--dry-run] [--timeout S]
    invoke lab.up [--hosts N] | lab.down | lab.status | lab.engine | lab.router | lab.private | lab.sglang | lab.nvml
        | lab.gpu | lab.xid

Every task but the lab's takes ``--inventory PATH`` (default ``$GPUDEPLOY_INVENTORY``, else
``inventory/hosts.yml``) and turns gpudeploy's errors into a message and exit 1, Ctrl-C into exit 130.
invoke's own ``--dry`` does not apply to them (they run nothing through invoke's shell) and is refused.
"""

from __future__ import annotations

from gpudeploy.cli.tasks import collection

ns = collection()
try:
    from gpudeploy_lab.tasks import lab_collection

    ns.add_collection(lab_collection)
except ImportError:  # pragma: no cover - the lab is optional outside this repo
    pass
