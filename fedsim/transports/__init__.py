"""The Transport protocol and its implementations: simulated in-process network and MQTT."""
