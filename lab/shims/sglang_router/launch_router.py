"""``python3 -m sglang_router.launch_router ARGS`` on lab hosts: the stand-in router."""

from gpudeploy_lab.standin.router import main

if __name__ == "__main__":
    raise SystemExit(main())
