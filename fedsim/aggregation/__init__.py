"""The server's mixing policy for one time window, as a small replaceable strategy object."""
