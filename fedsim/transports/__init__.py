"""The Endpoint protocol and its implementations: the simulated in-process network and MQTT
(with its broker, credentials and topics)."""
