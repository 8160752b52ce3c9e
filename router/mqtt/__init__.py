"""The MQTT frontend: a sans-I/O codec for MQTT 3.1.1 and 5.0 (packets, validation, topics)."""
