"""The Redis engine: :mod:`.engine` (the node's connections to Redis and its realms), one module
per part a realm shares (:mod:`.realm`: interest, forwarding, retained events; :mod:`.dealer`;
:mod:`.membership`; :mod:`.claims`; :mod:`.sessions`; :mod:`.links`; :mod:`.history`;
:mod:`.failure`), the RESP client (:mod:`.resp`) and the Lua scripts (:mod:`.lua`)."""
