"""The store: the schema (models, and the tables mapped beside them) and the database."""

from keyserver.store import databases as databases  # maps its tables on models.Base
from keyserver.store import xks as xks  # maps its tables on models.Base
