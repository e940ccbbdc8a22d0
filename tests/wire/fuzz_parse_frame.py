"""Coverage-guided fuzz target for ``wire.parse_frame`` (atheris; not run in CI).

    pip install atheris
    python tests/wire/fuzz_parse_frame.py -max_total_time=600 tests/wire/hostile/

Anything but ``ProtocolError`` escaping ``parse_frame`` (JSON frames, and binary call frames
against a fixed signature) is a bug; atheris reports it with
the input that caused it. Without atheris the script says so and exits 0.
"""

import sys

try:
    import atheris
except ImportError:  # not installed: the target stays importable (the tests call it)
    atheris = None

if atheris is not None:
    with atheris.instrument_imports():
        from xstage_remote import wire
else:
    from xstage_remote import wire


#: A loaded signature, so binary call frames (``XSB1``) reach their header check too.
CODEC = wire.FastCodec(["x", "mask", "ids"], ["y", "z"])


def TestOneInput(data):  # noqa: N802 (the name atheris expects)
    try:
        frame = wire.parse_frame(data, codec=CODEC)
    except wire.ProtocolError:
        return
    frame.arrays()


def main():
    if atheris is None:
        sys.stdout.write("atheris is not installed (pip install atheris); nothing to do\n")
        return 0
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
