"""Print the REST API's OpenAPI document as JSON, without a server, database or HSM.

`create_app` only stores its services object, so a placeholder is enough to build the
routes and ask FastAPI for the schema. The web console's typed client is generated
from this output (`npm run gen:api` in webui/), and a test checks it is not stale.

    python -m keyserver.api.openapi_dump > openapi.json
"""

from __future__ import annotations

import json
import sys
from typing import Any, cast

from keyserver.api.app import create_app
from keyserver.services import Services


class _NoServices:
    """Stands in for `Services`: any use of it is a bug in this script."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"openapi_dump must not use services (asked for {name!r})")


def openapi_document() -> dict[str, Any]:
    app = create_app(cast(Services, _NoServices()), run_background=False)
    return app.openapi()


def main() -> None:
    json.dump(openapi_document(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
