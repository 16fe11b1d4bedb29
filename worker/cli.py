"""`engram`, the console script: the process commands (up, worker, api, mcp) start servers here;
every other command is an API client (api.cli)."""

from __future__ import annotations

from api import cli


def main(argv: list[str] | None = None) -> None:
    args = cli.build_parser().parse_args(argv)
    if args.command == "up":
        from worker.up import main as up_main

        up_main()
    elif args.command == "worker":
        from worker.main import worker_main

        worker_main()
    elif args.command == "api":
        from worker.main import api_main

        api_main()
    elif args.command == "mcp":
        from api.mcp_server import main as mcp_main

        mcp_main(args)
    else:
        cli.run(args)


if __name__ == "__main__":
    main()
