"""Entry point inside a route's interpreter: ``worker`` (serve one stage) or ``probe``.

The client starts this through ``xstage.client.staging.worker_argv``; nothing else should.
"""

import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    mode = argv[0] if argv else ""
    if mode == "probe":
        from . import probe

        return probe.main(argv[1:])
    if mode == "worker":
        from . import worker

        return worker.main(argv[1:])
    sys.stderr.write("usage: xstage_remote {worker|probe} ...\n")
    sys.exit(64)


if __name__ == "__main__":
    main()
