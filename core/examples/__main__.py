"""``python -m ember.examples LIST | NAME [options]``."""
from __future__ import annotations

import sys

from . import EXAMPLES, load


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("LIST", "list", "-h", "--help"):
        print("usage: python -m ember.examples NAME [options]   (NAME --help for its options)\n")
        w = max(map(len, EXAMPLES))
        for name, (_, line) in EXAMPLES.items():
            print(f"  {name:<{w}}  {line}")
        return 0
    try:
        mod = load(argv[0])
    except KeyError as e:
        print(f"ember.examples: {e.args[0]}", file=sys.stderr)
        return 2
    try:
        return mod.main(argv[1:])
    except FileNotFoundError as e:     # data or demos missing (an installed wheel has no demos/)
        print(f"ember.examples {argv[0]}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
