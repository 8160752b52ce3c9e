"""The Redis engine: :mod:`.engine` (the node's connection and realms), one module per part it
shares (:mod:`.dealer`, :mod:`.claims`, :mod:`.sessions`, :mod:`.links`, :mod:`.history`,
:mod:`.failure`), the RESP client (:mod:`.resp`) and the Lua scripts (:mod:`.lua`)."""
