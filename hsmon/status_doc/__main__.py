"""``python -m hsmon.status_doc --schema``: print the status document's JSON Schema."""

from __future__ import annotations

import json
import sys

from hsmon.status_doc import schema


def main(argv: list[str]) -> int:
    if argv != ["--schema"]:
        print("usage: python -m hsmon.status_doc --schema  (prints the JSON Schema of the status "
              "document; docs/status-schema.json holds it)", file=sys.stderr)
        return 2
    print(json.dumps(schema(), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
