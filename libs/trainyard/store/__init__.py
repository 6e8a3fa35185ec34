"""Redis projections: fast, derived state rebuilt from the streams at will.

Each projection is a fold of one stream applied by a Lua script that records
the last stream sequence it applied, so applying an event twice (two
projectors, a redelivery, a restart) changes nothing.
"""

from trainyard.store.projector import Projector
from trainyard.store.store import Store
from trainyard.store.views import NodeRecord

__all__ = ["NodeRecord", "Projector", "Store"]
