"""`python -m testserve [--host 127.0.0.1] [--port 9000] [--workers 1]`: serve testserve with Granian."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="testserve", description="Emulated LLM providers for meshfast.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--workers", type=int, default=1,
                        help="Granian worker processes; each keeps its own /_debug state")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    from granian.constants import Interfaces
    from granian.log import LogLevels
    from granian.server import Server

    Server("testserve.app:app", address=args.host, port=args.port, interface=Interfaces.RSGI,
           workers=args.workers, log_level=LogLevels(args.log_level), backlog=2048).serve()


if __name__ == "__main__":
    main()
