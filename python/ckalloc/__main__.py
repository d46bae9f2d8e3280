"""``python -m ckalloc ARGS`` and the ``ckalloc`` command: the ``ckalloc``
program installed inside this package (``ckalloc run -- CMD``, ``ckalloc
probe``, ...), which finds the preload library beside it. Replaces this
process, so the exit status is the program's."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    program = os.path.join(_HERE, "bin", "ckalloc")
    if not os.access(program, os.X_OK):
        sys.exit(f"ckalloc: {program}: not installed with this package")
    # Python's own buffers, when the streams exist (a closed descriptor
    # leaves them None), go out before the program replaces this process.
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os.execv(program, [program] + args)


if __name__ == "__main__":
    main()
