"""The MQTT 3.1.1 and 5.0 frontend: a sans-I/O codec (:mod:`.primitives`, :mod:`.tables`,
:mod:`.codec`, :mod:`.packets`), one connection per socket (:mod:`.connection`), one session
per client id that outlives it (:mod:`.session`, behind :mod:`.outlet`), and the realm's
frontend that translates to the core (:mod:`.frontend`). An inbound PUBLISH goes
``MqttConnection._publish`` -> ``MqttFrontend.publish`` -> ``Realm.publish``."""
