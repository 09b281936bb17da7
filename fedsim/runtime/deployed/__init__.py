"""The deployed runtime: the same actors as separate processes over a real MQTT broker."""
