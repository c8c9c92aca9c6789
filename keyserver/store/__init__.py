"""The store: the schema (models, and the tables mapped beside them) and the database."""

from keyserver.store import databases as databases  # maps its tables on models.Base
from keyserver.store import kmip_grants as kmip_grants  # maps its table on models.Base
from keyserver.store import retirement as retirement  # maps its tables on models.Base
from keyserver.store import xks as xks  # maps its tables on models.Base
