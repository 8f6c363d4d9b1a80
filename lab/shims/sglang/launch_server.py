"""``python3 -m sglang.launch_server ARGS`` on lab hosts: the stand-in engine."""

from gpudeploy_lab.standin.engine import main

if __name__ == "__main__":
    raise SystemExit(main())
